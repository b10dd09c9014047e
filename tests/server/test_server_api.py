"""The OpenAI-compatible endpoints over the real driver with fake instances (no jax, no model):
token-id prompts, exact statuses and messages for every refusal, streams and whole answers,
stop strings, disconnects, draining. The model-backed server is in tests/server/test_server.py."""

import json
import time

import pytest
from fastapi.testclient import TestClient

from pdjax.engine.options import EngineOptions
from pdjax.server.app import make_app
from pdjax.server.driver_bridge import DriverBridge
from pdjax.server.text_stream import TextStream

from helpers.fake_engine import OPTS, FakeInstance


class _Clock:
  """FakePending advances its clock by the step's cost; a served run is on the wall clock."""

  def advance(self, seconds):
    time.sleep(seconds / 10)


class Digits:
  """A tokenizer for fake tokens: token t reads as str(t % 10)."""
  chat_template = None

  def encode(self, text):
    return [int(c) for c in text]

  def decode(self, ids):
    return "".join(str(i % 10) for i in ids)


MODEL = "fake"


@pytest.fixture
def server():
  inst = FakeInstance("colocated-0", _Clock(), num_pages=32)
  inst.role = "colocated"
  inst.opts = EngineOptions(page_size=4, num_pages=32, max_model_len=OPTS.max_model_len,
                            prefill_buckets=(16,), max_prefill_seqs=4, decode_buckets=(4,))
  engine = DriverBridge("colocated", [inst], tokenizer=Digits(), eos_ids=(110,),
                        tenant_quota_pages=4)
  engine.start()
  app = make_app(engine, model_name=MODEL, max_model_len=OPTS.max_model_len, vocab_size=1000)
  with TestClient(app) as client:
    yield engine, client
  if engine.alive:
    engine.stop(grace_s=0.0)


def _post(client, path, **body):
  return client.post(path, json={"model": MODEL, **body})


def test_whole_completion_and_usage(server):
  _, client = server
  r = _post(client, "/v1/completions", prompt=[7, 7, 7, 7, 7], max_tokens=3, temperature=0)
  assert r.status_code == 200
  body = r.json()
  # fake tokens: 100 + length, read as its last digit
  assert body["choices"][0]["text"] == "567"
  assert body["choices"][0]["finish_reason"] == "length"
  assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
  assert body["id"].startswith("cmpl-") and body["object"] == "text_completion"


def test_eos_ends_with_stop_and_no_text(server):
  _, client = server
  r = _post(client, "/v1/completions", prompt=[1] * 8, max_tokens=6)   # 108, 109, 110 (EOS)
  assert r.json()["choices"][0] | {} == {"index": 0, "text": "89", "logprobs": None,
                                         "finish_reason": "stop"}


def test_stream_chunks_usage_and_done(server):
  _, client = server
  with client.stream("POST", "/v1/completions",
                     json={"model": MODEL, "prompt": [3] * 4, "max_tokens": 4, "stream": True,
                           "stream_options": {"include_usage": True}}) as r:
    assert r.status_code == 200
    lines = [l for l in r.iter_lines() if l]
  assert lines[-1] == "data: [DONE]"
  chunks = [json.loads(l[len("data: "):]) for l in lines[:-1]]
  assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == "4567"
  assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
  assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
  assert len({c["id"] for c in chunks}) == 1


def test_stop_string_ends_the_request_early(server):
  engine, client = server
  r = _post(client, "/v1/completions", prompt=[2] * 2, max_tokens=8, stop=["45"])
  assert r.json()["choices"][0]["text"] == "23"          # 102 103 104 105: "45" ends it
  assert r.json()["choices"][0]["finish_reason"] == "stop"
  assert r.json()["usage"]["completion_tokens"] == 4
  (req,) = [q for q in engine.ended_requests() if q.id == r.json()["id"]]
  assert req.status.value == "finished" and req.output_ids == [102, 103, 104, 105]


@pytest.mark.parametrize("body,status,message", [
    ({"prompt": []}, 400, "the prompt is empty"),
    ({"prompt": [1] * 20, "max_tokens": 10}, 400,
     "prompt_len + max_tokens = 30 exceeds max_model_len = 24"),
    ({"prompt": [1], "logprobs": 2}, 400, "unsupported parameter: 'logprobs'"),
    ({"prompt": [1], "n": 2}, 400, "n=2 is not supported (only n=1)"),
    ({"prompt": [1], "model": "gpt-9"}, 400,
     "model 'gpt-9' is not served here (this server serves 'fake')"),
    ({"prompt": [1], "temperature": 3}, 400, "temperature=3 must be a number in [0, 2]"),
    ({"prompt": [1], "top_p": 0}, 400, "top_p must be in (0, 1]"),
    ({"prompt": [1], "stop": ["a", "b", "c", "d", "e"]}, 400,
     "stop must be a non-empty string or a list of up to 4"),
    ({"prompt": [5000]}, 400, "prompt token id 5000 is outside the vocabulary [0, 1000)"),
    ({"prompt": ["a", "b"]}, 400, "one prompt per request (got 2)"),
    # admission: a tenant KV quota of 4 pages (page size 4): 3 + 14 tokens need 5
    ({"prompt": [1] * 3, "max_tokens": 14}, 429,
     "tenant '' over its KV quota on the colocated tier: 0 + 5 pages > 4"),
], ids=["empty", "too-long", "unsupported", "n", "model", "temperature", "top_p", "stops",
        "vocab", "two-prompts", "quota"])
def test_refusals_name_the_problem_and_the_server_keeps_serving(server, body, status, message):
  _, client = server
  r = client.post("/v1/completions", json={"model": MODEL, **body})
  assert r.status_code == status
  assert r.json()["error"]["message"] == message
  assert _post(client, "/v1/completions", prompt=[7] * 5, max_tokens=2).status_code == 200


def test_malformed_json_and_chat_without_template(server):
  _, client = server
  r = client.post("/v1/completions", content=b"{not json")
  assert r.status_code == 400
  assert r.json()["error"]["message"].startswith("the request body is not valid JSON: ")
  r = _post(client, "/v1/chat/completions", messages=[{"role": "user", "content": "12"}])
  assert r.status_code == 400
  assert r.json()["error"]["message"] == ("chat requests need a chat template; this server's "
                                          "model has none")


def test_models_health_and_draining(server):
  engine, client = server
  assert client.get("/v1/models").json()["data"][0]["id"] == MODEL
  assert client.get("/health").json() == {"status": "ok"}
  engine.draining = True
  r = _post(client, "/v1/completions", prompt=[1], max_tokens=1)
  assert (r.status_code, r.json()["error"]["message"]) == (503, "the server is shutting down")
  assert client.get("/health").status_code == 503
  result = engine.stop(grace_s=1.0)
  assert [r.status.value for r in result.requests] == []


def test_text_stream_holds_back_a_split_stop_and_unfinished_characters():
  class Bytes:   # token t is byte t; an unfinished UTF-8 sequence decodes to U+FFFD
    def decode(self, ids):
      return bytes(ids).decode("utf-8", errors="replace")

  s = TextStream(Bytes(), stops=("END",))
  pieces = [s.add(t) for t in "héllo EN".encode()]
  assert "".join(pieces) == "héllo " and not s.stopped    # "EN" may start "END": held
  pieces += [s.add(t) for t in b"DX"]
  assert "".join(pieces) == "héllo " and s.stopped and s.finish() == ""
  assert "\ufffd" not in "".join(pieces)
  t = TextStream(Bytes())
  out = "".join(t.add(b) for b in "añb".encode()) + t.finish()
  assert out == "añb"


def test_without_a_tokenizer_answers_carry_token_ids():
  inst = FakeInstance("colocated-0", _Clock(), num_pages=32)
  inst.role = "colocated"
  inst.opts = EngineOptions(page_size=4, num_pages=32, max_model_len=OPTS.max_model_len,
                            prefill_buckets=(16,), max_prefill_seqs=4, decode_buckets=(4,))
  engine = DriverBridge("colocated", [inst], tokenizer=None, eos_ids=(110,))
  engine.start()
  app = make_app(engine, model_name=MODEL, max_model_len=OPTS.max_model_len, vocab_size=1000)
  with TestClient(app) as client:
    r = _post(client, "/v1/completions", prompt=[1] * 7, max_tokens=5)
    assert r.json()["choices"][0] | {} == {"index": 0, "text": "", "logprobs": None,
                                           "finish_reason": "stop", "token_ids": [107, 108, 109]}
    with client.stream("POST", "/v1/completions", json={"model": MODEL, "prompt": [1] * 7,
                                                        "max_tokens": 2, "stream": True}) as s:
      chunks = [json.loads(l[6:]) for l in s.iter_lines() if l.startswith("data: {")]
    assert [c["choices"][0].get("token_ids") for c in chunks] == [[107], [108], None]
    r = _post(client, "/v1/completions", prompt="12")
    assert (r.status_code, r.json()["error"]["message"]) == (
        400, "text prompts need a tokenizer; this server has none (send token ids)")
  result = engine.stop(grace_s=1.0)
  assert [q.status.value for q in result.requests] == ["finished", "finished"]
