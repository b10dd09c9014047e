"""API keys and tenants at the server's edge (issue 47, item 10): keys compared in constant time
over their hashes, /metrics behind the keys (server.metrics_public opens it), tenant names that
cannot alias another tenant's cache_salt namespace, and a tenant flush that cannot wipe a
cache shared by every tenant (kv.shared_salt). Fake instances, no model."""

import contextlib
import hmac
import json
import time

import pytest
from fastapi.testclient import TestClient

from pdjax.engine.options import EngineOptions
from pdjax.server import protocol
from pdjax.server.app import make_app
from pdjax.server.driver_bridge import DriverBridge

from helpers.fake_engine import OPTS, FakeInstance
from test_engine_process import FakePlan, _app, _started, _wait_for

MODEL = "fake"
KEYS = {"key-a": "team-a", "key-b": "team-b"}
A = {"Authorization": "Bearer key-a"}
B = {"Authorization": "Bearer key-b"}


class _Clock:
  def advance(self, seconds):
    time.sleep(seconds / 10)


class Digits:
  chat_template = None

  def encode(self, text):
    return [int(c) for c in text]

  def decode(self, ids):
    return "".join(str(i % 10) for i in ids)


@contextlib.contextmanager
def _serving(*, shared_salt: str = "", metrics=None, **app_kwargs):
  """A one-instance fake server with the prefix cache on (pages of 4 tokens)."""
  inst = FakeInstance("colocated-0", _Clock(), num_pages=32)
  inst.role = "colocated"
  inst.opts = EngineOptions(page_size=4, num_pages=32, max_model_len=OPTS.max_model_len,
                            prefill_buckets=(16,), max_prefill_seqs=4, decode_buckets=(4,))
  inst.tables.enable_prefix_cache(0, 0.0, "lru")
  engine = DriverBridge("colocated", [inst], tokenizer=Digits(), eos_ids=(110,),
                        metrics=metrics, shared_salt=shared_salt)
  engine.start()
  app = make_app(engine, model_name=MODEL, max_model_len=OPTS.max_model_len, vocab_size=1000,
                 metrics=metrics, **app_kwargs)
  try:
    with TestClient(app) as client:
      yield engine, client
  finally:
    if engine.alive:
      engine.stop(grace_s=0.0)


def _error(r):
  assert r.status_code >= 400 and r.headers["content-type"] == "application/json", (
      r.status_code, r.headers["content-type"], r.text[:120])
  assert set(r.json()) == {"error"}, r.text
  return r.status_code, r.json()["error"]


def _ask(engine, client, headers, **extra) -> int:
  """The prompt tokens a 12-token request found cached."""
  r = client.post("/v1/completions", headers=headers,
                  json={"model": MODEL, "prompt": list(range(1, 13)), "max_tokens": 1, **extra})
  assert r.status_code == 200, r.text
  return next(q.cached_tokens for q in engine.ended_requests() if q.id == r.json()["id"])


def test_keys_are_compared_in_constant_time_over_their_hashes(monkeypatch):
  """Every configured key is compared (no early exit on a match or on the first differing
  byte: a dict lookup's timing tells how much of a guess is right), with
  hmac.compare_digest, over fixed-size digests, never the plaintext key."""
  calls = []
  real = hmac.compare_digest

  def spy(a, b):
    calls.append((a, b))
    return real(a, b)

  monkeypatch.setattr(hmac, "compare_digest", spy)
  with _serving(api_keys=KEYS) as (_, client):
    for key, status in (("key-a", 200), ("key-b", 200), ("nope", 401), ("key-", 401)):
      calls.clear()
      r = client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
      assert r.status_code == status
      assert len(calls) == len(KEYS)
      for a, b in calls:
        assert len(a) == len(b) == 32 and key.encode() not in (a, b)


def test_metrics_need_a_key_when_keys_are_set():
  from pdjax.server.prometheus import ServerMetrics
  with _serving(api_keys=KEYS, metrics=ServerMetrics(model_name=MODEL)) as (_, client):
    assert _error(client.get("/metrics")) == (401, {
        "message": "this server needs an API key: Authorization: Bearer <key>",
        "type": "authentication_error", "param": None, "code": 401})
    r = client.get("/metrics", headers={"Authorization": "Bearer nope"})
    assert _error(r)[1]["message"] == "the API key is not valid"
    r = client.get("/metrics", headers=A)
    assert r.status_code == 200 and "pdjax:" in r.text


def test_server_metrics_public_opens_metrics_to_anyone():
  from pdjax.configs.default import get_config
  from pdjax.server.prometheus import ServerMetrics
  assert get_config().server.metrics_public is False
  with _serving(api_keys=KEYS, metrics=ServerMetrics(model_name=MODEL),
                metrics_public=True) as (_, client):
    r = client.get("/metrics")
    assert r.status_code == 200 and "pdjax:" in r.text
    assert _error(client.get("/v1/models"))[0] == 401   # only /metrics opens


def test_a_tenant_name_holding_the_salt_separator_is_refused(tmp_path):
  """Page salts are "tenant:<name>" and "tenant:<name>/salt:<cache_salt>": a tenant named
  "team-a/salt:x" would share pages with team-a's requests of cache_salt "x" (and team-a's
  flush would wipe its pages). Such a key file is refused where it loads (the server's
  config check), and by make_app."""
  path = tmp_path / "keys.json"
  path.write_text(json.dumps({"key-a": "team-a", "key-x": "team-a/salt:x"}))
  with pytest.raises(ValueError) as e:
    protocol.load_api_keys(str(path))
  assert str(e.value) == (
      f"server.api_keys={str(path)!r}: tenant 'team-a/salt:x' (of key #2) contains '/salt:', "
      "which separates a tenant from its requests' cache_salt")
  with pytest.raises(ValueError, match="contains '/salt:'"):
    make_app(None, model_name=MODEL, max_model_len=24, vocab_size=1000,
             api_keys={"key-a": "team-a", "key-x": "team-a/salt:x"})


@pytest.mark.parametrize("tenant,message", [
    ("a/salt:x", "tenant 'a/salt:x' contains '/salt:', which separates a tenant from its "
                 "requests' cache_salt"),
    ("a\nb", "tenant 'a\\nb' must be printable text of at most 256 characters"),
    ("t" * 257, "tenant 'tttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttt"
                "tttttttttttttttttttttttttttttt...' must be printable text of at most 256 "
                "characters"),
], ids=["separator", "control", "long"])
def test_a_flush_of_a_tenant_name_no_key_file_could_hold_is_400(tenant, message):
  with _serving() as (_, client):
    assert _error(client.post("/v1/kv/flush", json={"tenant": tenant})) == (400, {
        "message": message, "type": "invalid_request_error", "param": "tenant", "code": 400})


def test_with_a_shared_salt_a_tenants_flush_leaves_the_shared_cache():
  """kv.shared_salt: every tenant's pages are named under the one salt, so no page is one
  tenant's own: a tenant's flush is refused (409) rather than wiping what every tenant shares
  (a denial of service, and a way to time the others' prefixes)."""
  with _serving(api_keys=KEYS, shared_salt="public") as (engine, client):
    assert _ask(engine, client, A) == 0
    assert _ask(engine, client, B) == 8      # shared: team-b hits team-a's pages
    assert _error(client.post("/v1/kv/flush", headers=A)) == (409, {
        "message": "kv.shared_salt is set: every tenant's prefix-cache pages are shared, so "
                   "one tenant's cannot be flushed without wiping everyone's",
        "type": "invalid_request_error", "param": None, "code": 409})
    assert _ask(engine, client, B) == 8      # still there


def test_without_a_shared_salt_a_flush_still_forgets_the_tenants_pages():
  with _serving(api_keys=KEYS) as (engine, client):
    assert [_ask(engine, client, h) for h in (A, A, B)] == [0, 8, 0]
    r = client.post("/v1/kv/flush", headers=A)
    assert r.json() == {"object": "kv.flush", "tenant": "team-a", "pages": 3}
    assert [_ask(engine, client, h) for h in (A, B)] == [0, 8]


def test_the_shared_cache_refusal_crosses_from_the_engine_process():
  """pdjax.serve's engine runs in its own process (EngineClient): the refusal comes back as
  the same 409, not as a 500 of an unknown remote error."""
  engine = _started(SharedSaltPlan())
  try:
    _wait_for(lambda: engine.ready)
    with TestClient(_app(engine)) as client:
      assert _error(client.post("/v1/kv/flush", json={"tenant": "a"}))[0] == 409
      assert client.get("/health").json() == {"status": "ok"}
    engine.detach()
    assert engine.stop(1.0)["error"] is None
  finally:
    engine.close(0.0)



class SharedSaltPlan(FakePlan):
  """test_engine_process's fake plan, its driver under kv.shared_salt (pickled into the
  engine process: a module-level class)."""

  def build(self, startup):
    mode, instances, kwargs = super().build(startup)
    return mode, instances, {**kwargs, "shared_salt": "public"}
