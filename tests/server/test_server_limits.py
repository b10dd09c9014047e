"""The server's edges (issue 25): body size limit, prompts too long to tokenize, chat roles,
template errors, OpenAI error bodies everywhere, and which refusals are permanent (400),
transient (429) or about capacity (503). Fake instances, no model."""

import contextlib
import json
import os
import time

import pytest
from fastapi.testclient import TestClient

from pdjax.engine.options import EngineOptions
from pdjax.server import protocol
from pdjax.server.app import make_app
from pdjax.server.driver_bridge import DriverBridge
from pdjax.text import chat as chat_lib

from helpers.fake_engine import OPTS, FakeInstance

MODEL = "fake"
TEMPLATE = ("{% for m in messages %}{% if loop.index0 % 2 == 0 and m['role'] != 'user' %}"
            "{{ raise_exception('Conversation roles must alternate user/assistant/user/"
            "assistant/...') }}{% endif %}{{ m['content'] }}{% endfor %}")


class _Clock:
  def advance(self, seconds):
    time.sleep(seconds / 10)


class DigitsWithTemplate:
  """Token t reads as str(t % 10); every vocabulary entry is one character; a chat template
  that refuses roles that do not alternate. encode() counts its calls."""
  chat_template = TEMPLATE
  vocab_strings = tuple(str(d) for d in range(10))

  def __init__(self):
    self.encoded_chars = 0

  def encode(self, text):
    self.encoded_chars += len(text)
    return [int(c) for c in text]

  def decode(self, ids):
    return "".join(str(i % 10) for i in ids)

  def encode_chat(self, messages):
    return self.encode(chat_lib.render(self.chat_template, messages, {}))


@contextlib.contextmanager
def _serving(num_pages: int, *, prefix_cache: bool = False, metrics=None, **app_kwargs):
  """(engine, client, tokenizer) of a one-instance fake server with pages of 4 tokens; the
  engine is stopped on exit."""
  inst = FakeInstance("colocated-0", _Clock(), num_pages=num_pages)
  inst.role = "colocated"
  inst.opts = EngineOptions(page_size=4, num_pages=num_pages, max_model_len=OPTS.max_model_len,
                            prefill_buckets=(16,), max_prefill_seqs=4, decode_buckets=(4,))
  if prefix_cache:
    inst.tables.enable_prefix_cache(0, 0.0, "lru")
  tokenizer = DigitsWithTemplate()
  engine = DriverBridge("colocated", [inst], tokenizer=tokenizer, eos_ids=(110,),
                        metrics=metrics)
  engine.start()
  app = make_app(engine, model_name=MODEL, max_model_len=OPTS.max_model_len, vocab_size=1000,
                 metrics=metrics, **app_kwargs)
  try:
    with TestClient(app) as client:
      yield engine, client, tokenizer
  finally:
    if engine.alive:
      engine.stop(grace_s=0.0)


@pytest.fixture
def server():
  with _serving(4, max_body_bytes=200) as served:
    yield served


def _error(r):
  assert set(r.json()) == {"error"}, r.text
  return r.status_code, r.json()["error"]


def test_a_body_over_the_limit_is_413_and_the_server_keeps_serving(server):
  _, client, _ = server
  big = json.dumps({"model": MODEL, "prompt": [1] * 100}).encode()
  assert len(big) > 200
  status, err = _error(client.post("/v1/completions", content=big))
  assert (status, err["message"], err["type"], err["code"]) == (
      413, "the request body is larger than 200 bytes (server.max_body_bytes)",
      "invalid_request_error", 413)
  # Without a Content-Length (chunked): refused while it streams in.
  status, err = _error(client.post("/v1/completions", content=iter([big[:150], big[150:]])))
  assert status == 413
  r = client.post("/v1/completions", json={"model": MODEL, "prompt": [7] * 5, "max_tokens": 2})
  assert r.status_code == 200


def test_a_prompt_with_more_characters_than_can_fit_is_refused_before_tokenizing(server):
  _, client, tokenizer = server
  # max_model_len 24 tokens x the longest vocabulary entry (1 character) = 24 characters.
  status, err = _error(client.post("/v1/completions",
                                   json={"model": MODEL, "prompt": "1" * 25}))
  assert (status, err["message"], err["param"]) == (
      400, "the prompt has 25 characters, more than the 24 that max_model_len tokens can hold",
      "prompt")
  assert tokenizer.encoded_chars == 0
  status, err = _error(client.post("/v1/chat/completions", json={
      "model": MODEL, "messages": [{"role": "user", "content": "1" * 30}]}))
  assert (status, err["param"]) == (400, "messages")
  assert tokenizer.encoded_chars == 0


@pytest.mark.parametrize("messages,message", [
    ([{"role": "wizard", "content": "1"}],
     "message role 'wizard' is not one of system, user, assistant, tool"),
    ([{"role": "assistant", "content": "1"}],
     "chat template: Conversation roles must alternate user/assistant/user/assistant/..."),
], ids=["unknown-role", "template-refuses"])
def test_bad_roles_and_template_errors_are_400(server, messages, message):
  _, client, _ = server
  status, err = _error(client.post("/v1/chat/completions",
                                   json={"model": MODEL, "messages": messages}))
  assert (status, err["message"], err["param"]) == (400, message, "messages")
  r = client.post("/v1/chat/completions", json={
      "model": MODEL, "messages": [{"role": "user", "content": "12"}], "max_tokens": 2})
  assert r.status_code == 200


def test_unknown_routes_and_methods_answer_in_openai_shape(server):
  _, client, _ = server
  assert _error(client.get("/v1/nope")) == (404, {
      "message": "Not Found", "type": "not_found_error", "param": None, "code": 404})
  assert _error(client.get("/v1/completions"))[0] == 405


def test_a_request_the_cluster_can_never_serve_is_400_not_a_retryable_429(server):
  _, client, _ = server
  # 4 pages of 4 tokens: 3 + 14 tokens need 5 pages, more than the pool (permanent).
  status, err = _error(client.post("/v1/completions", json={
      "model": MODEL, "prompt": [1] * 3, "max_tokens": 14}))
  assert (status, err["message"]) == (400, "needs 5 KV pages, the pool has 4")


def test_refusal_status_by_kind():
  assert protocol.refusal_status("needs 5 KV pages, the pool has 4", draining=False) == 400
  assert protocol.refusal_status("empty prompt", draining=False) == 400
  assert protocol.refusal_status("no instance in the decode tier", draining=False) == 503
  assert protocol.refusal_status("tenant 'a' over its KV quota on the colocated tier: 0 + 5 "
                                 "pages > 4", draining=False) == 429
  assert protocol.refusal_status("queue full: 32 waiting", draining=False) == 429
  assert protocol.refusal_status("queue full: 32 waiting", draining=True) == 503


KEYS = {"key-a": "team-a", "key-b": "team-b"}


@pytest.fixture
def keyed():
  """A server with API keys and the prefix cache on (pages of 4 tokens)."""
  with _serving(32, prefix_cache=True, api_keys=KEYS) as (engine, client, _):
    yield engine, client


def _ask(client, key, **extra):
  r = client.post("/v1/completions", headers={"Authorization": f"Bearer {key}"},
                  json={"model": MODEL, "prompt": list(range(1, 13)), "max_tokens": 1, **extra})
  assert r.status_code == 200, r.text
  return r.json()["id"]


def test_api_keys_are_required_and_decide_the_tenant(keyed):
  engine, client = keyed
  for headers, message in (({}, "this server needs an API key: Authorization: Bearer <key>"),
                           ({"Authorization": "Bearer nope"}, "the API key is not valid")):
    r = client.post("/v1/completions", headers=headers, json={"model": MODEL, "prompt": [1]})
    assert _error(r) == (401, {"message": message, "type": "authentication_error",
                               "param": None, "code": 401})
    assert _error(client.get("/v1/models", headers=headers))[0] == 401
  assert client.get("/v1/models", headers={"Authorization": "Bearer key-a"}).status_code == 200
  rid = _ask(client, "key-b")
  assert [r.tenant for r in engine.ended_requests() if r.id == rid] == ["team-b"]


def test_tenants_and_cache_salts_never_share_prefix_hits(keyed):
  engine, client = keyed
  order = [_ask(client, "key-a"),                       # team-a fills the cache: 12 tokens
           _ask(client, "key-a"),                       # team-a again: 2 full pages hit
           _ask(client, "key-b"),                       # another tenant: no hit
           _ask(client, "key-a", cache_salt="s1"),      # team-a, another salt: no hit
           _ask(client, "key-a", cache_salt="s1")]      # the same salt again: hit
  by_id = {r.id: r for r in engine.ended_requests()}
  assert [by_id[i].cached_tokens for i in order] == [0, 8, 0, 0, 8]


def test_a_key_flushes_its_own_tenants_kv_and_no_one_elses(keyed):
  """POST /v1/kv/flush with team-a's key forgets team-a's pages, its cache_salt's too (3 full
  pages each: the 12 prompt tokens, named once computed), and not team-b's; asking for another
  tenant is refused."""
  engine, client = keyed
  key_a = {"Authorization": "Bearer key-a"}
  first = [_ask(client, "key-a"), _ask(client, "key-a", cache_salt="s1"), _ask(client, "key-b")]
  r = client.post("/v1/kv/flush", headers=key_a, json={"tenant": "team-b"})
  assert _error(r) == (403, {"message": "an API key may flush only its own tenant's KV",
                             "type": "permission_error", "param": "tenant", "code": 403})
  r = client.post("/v1/kv/flush", headers=key_a)
  assert r.status_code == 200 and r.json() == {"object": "kv.flush", "tenant": "team-a",
                                               "pages": 6}
  after = [_ask(client, "key-a"), _ask(client, "key-a", cache_salt="s1"), _ask(client, "key-b")]
  by_id = {r.id: r for r in engine.ended_requests()}
  assert [by_id[i].cached_tokens for i in first + after] == [0, 0, 0, 0, 0, 8]
  assert _error(client.post("/v1/kv/flush", json={}))[0] == 401


def test_a_stop_string_counts_as_stop_in_metrics():
  from pdjax.server.prometheus import ServerMetrics
  metrics = ServerMetrics(model_name=MODEL)
  with _serving(32, metrics=metrics) as (_, client, _):
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": [2, 2], "max_tokens": 8,
                                             "stop": ["45"]})
    assert r.json()["choices"][0]["finish_reason"] == "stop"
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": [2, 2], "max_tokens": 2})
    assert r.json()["choices"][0]["finish_reason"] == "length"
    text = client.get("/metrics").text
  counts = {line.split('finished_reason="')[1].split('"')[0]: float(line.split()[-1])
            for line in text.splitlines() if line.startswith("pdjax:request_success_total")}
  assert counts == {"stop": 1.0, "length": 1.0}


def test_compare_all_serves_the_disaggregated_engine_and_hybrid_is_refused_in_one_line():
  import subprocess
  import sys

  from helpers.paths import ROOT
  from pdjax.configs.default import get_config
  from pdjax.server.http_server import run_name
  cfg = get_config()
  cfg.mode = "compare_all"
  assert run_name(cfg) == "disaggregated"
  proc = subprocess.run([sys.executable, "-m", "pdjax.serve", "--config=configs/default.py:smoke",
                         "--config.mode=hybrid", "--port=1"], cwd=ROOT, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode != 0
  assert proc.stderr.strip().splitlines()[-1] == (
      "config error: mode='hybrid' is not served yet (pdjax.run runs it); serve colocated, "
      "chunked or disaggregated")


def test_the_arena_cap_reaches_the_engine_process_by_the_environment(monkeypatch):
  """mallopt caps the HTTP process's arenas; the engine process is spawned (a fresh glibc), so
  the cap must be in the environment it inherits. A value the user set wins, untouched."""
  from pdjax.server.http_server import limit_malloc_arenas
  monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
  assert limit_malloc_arenas() is True
  assert os.environ["MALLOC_ARENA_MAX"] == "2"
  monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
  assert limit_malloc_arenas() is False and os.environ["MALLOC_ARENA_MAX"] == "4"
