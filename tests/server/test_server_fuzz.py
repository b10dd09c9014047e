"""Bad inputs against the HTTP API (issue 47, item 12): hypothesis generates over 2,000 requests
to /v1/completions, /v1/chat/completions, /v1/kv/flush and unknown paths (invalid JSON, wrong
types, huge and negative numbers, unicode with control characters and lone surrogates, deep
nesting, missing fields, wrong content types, oversized bodies, odd methods and API keys).
Every answer is below 500; every refusal is a 4xx in OpenAI's error body, short (a client's
value is not echoed back whole); no connection is dropped. After each batch the server is
still up: /health answers 200, the driver thread is alive, and a fixed valid request returns
the same tokens as before the fuzz.

The server is the real HTTP stack of pdjax.serve (uvicorn with DrainingServer and RetryAfter
around make_app) on a loopback port, in this process, over the driver with a fake instance
(tests/helpers/fake_engine.py: no jax), with the prefix cache on and a byte-level tokenizer
with a chat template. Reproducible: derandomize=True; counts in BENCHMARKS.md ("Bad inputs
(issue 47, item 12)")."""

import collections
import contextlib
import json
import threading
import time

import httpx
import pytest
import uvicorn
from hypothesis import HealthCheck, given, settings, strategies as st

from pdjax.engine.options import EngineOptions
from pdjax.server.app import make_app
from pdjax.server.driver_bridge import DriverBridge
from pdjax.server.http_server import DrainingServer, RetryAfter
from pdjax.text import chat as chat_lib

from helpers.fake_engine import OPTS, FakeInstance
from helpers.server_process import free_port

MODEL = "fake"
MAX_BODY = 16 * 1024          # server.max_body_bytes here: oversized bodies stay cheap
KEYS = {"key-a": "team-a", "key-b": "team-b"}
VALID = {"model": MODEL, "prompt": [7] * 5, "max_tokens": 3, "temperature": 0}
MAX_ERROR_BYTES = 1024        # a refusal's whole body, whatever the request held
SENT: collections.Counter = collections.Counter()   # requests by (test, status class)


def fuzz_settings(n: int):
  return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))


class _Clock:
  def advance(self, seconds):
    time.sleep(seconds / 10)


class Bytes:
  """A byte-level tokenizer, as BPE tokenizers are (a text's UTF-8 bytes; lone surrogates
  cannot be encoded, as with Hugging Face's), with a chat template."""
  chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
  vocab_strings = tuple(str(i) for i in range(256))   # the longest entry: 3 characters

  def encode(self, text):
    return list(text.encode("utf-8"))

  def decode(self, ids):
    return bytes(i % 256 for i in ids).decode("utf-8", "replace")

  def encode_chat(self, messages):
    return self.encode(chat_lib.render(self.chat_template, messages, {}))


class _ThreadedServer(DrainingServer):
  """pdjax.serve's server, run on a thread (signals are the main thread's)."""

  def capture_signals(self):
    return contextlib.nullcontext()


@contextlib.contextmanager
def _http_server(api_keys=None):
  """(engine, base URL) of the fake-instance server on a free loopback port."""
  inst = FakeInstance("colocated-0", _Clock(), num_pages=64)
  inst.role = "colocated"
  inst.opts = EngineOptions(page_size=4, num_pages=64, max_model_len=OPTS.max_model_len,
                            prefill_buckets=(16,), max_prefill_seqs=4, decode_buckets=(4,))
  inst.tables.enable_prefix_cache(0, 0.0, "lru")
  engine = DriverBridge("colocated", [inst], tokenizer=Bytes(), eos_ids=(110,))
  engine.start()
  web = RetryAfter(make_app(engine, model_name=MODEL, max_model_len=OPTS.max_model_len,
                            vocab_size=1000, max_body_bytes=MAX_BODY, api_keys=api_keys))
  port = free_port()
  web.server = server = _ThreadedServer(
      uvicorn.Config(web, host="127.0.0.1", port=port, log_level="critical",
                     interface="asgi3", timeout_graceful_shutdown=1), engine, 0.0)
  thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
  thread.start()
  deadline = time.monotonic() + 30
  while not server.started:
    assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
    time.sleep(0.01)
  try:
    yield engine, f"http://127.0.0.1:{port}"
  finally:
    server.should_exit = True
    thread.join(30)
    if engine.alive:
      engine.stop(grace_s=0.0)


@pytest.fixture(scope="module")
def servers():
  """{"open": (engine, client), "keyed": (engine, client)} and the valid request's answer
  before any fuzz."""
  with _http_server() as (engine, url), _http_server(KEYS) as (keyed, keyed_url), \
      httpx.Client(base_url=url, timeout=30) as client, \
      httpx.Client(base_url=keyed_url, timeout=30) as keyed_client:
    served = {"open": (engine, client), "keyed": (keyed, keyed_client)}
    before = {name: _tokens(c, name) for name, (_, c) in served.items()}
    yield served, before
  total = sum(SENT.values())
  print(f"\nbad inputs tried: {total}, 5xx: {sum(n for (_, k), n in SENT.items() if k == '5xx')}"
        f" ({dict(sorted(SENT.items()))})")


def _auth(name: str) -> dict:
  return {"Authorization": "Bearer key-a"} if name == "keyed" else {}


def _tokens(client, name) -> list[int]:
  r = client.post("/v1/completions", json=VALID, headers=_auth(name))
  assert r.status_code == 200, r.text
  return [ord(c) for c in r.json()["choices"][0]["text"]]


def _still_serving(servers) -> None:
  served, before = servers
  for name, (engine, client) in served.items():
    assert engine.error is None and engine.alive
    assert client.get("/health").json() == {"status": "ok"}
    assert _tokens(client, name) == before[name]


def _check(test: str, r: httpx.Response) -> None:
  """Below 500; a refusal is OpenAI's error body, short; an answer is whole JSON or a whole
  SSE stream."""
  SENT[test, f"{r.status_code // 100}xx"] += 1
  assert r.status_code < 500, (r.status_code, r.text[:500])
  if r.status_code >= 400:
    assert r.headers["content-type"] == "application/json", r.headers
    assert len(r.content) <= MAX_ERROR_BYTES, r.text[:500]
    body = r.json()
    assert set(body) == {"error"}, body
    e = body["error"]
    assert set(e) == {"message", "type", "param", "code"}, e
    assert e["code"] == r.status_code and isinstance(e["type"], str)
    assert isinstance(e["message"], str) and e["message"]
    assert e["param"] is None or isinstance(e["param"], str)
    return
  assert r.status_code == 200, r.text[:500]
  if r.headers["content-type"].startswith("text/event-stream"):
    events = [line[len("data: "):] for line in r.text.splitlines() if line]
    assert events and events[-1] == "[DONE]", r.text[:500]
    for event in events[:-1]:
      assert "error" not in json.loads(event), event
  else:
    assert isinstance(r.json(), dict)


# ---- what is sent -----------------------------------------------------------------------------

ANY_CHAR = st.characters(categories=["L", "M", "N", "P", "S", "Z", "Cc", "Cf", "Cs", "Co", "Cn"])
TEXT = st.text(ANY_CHAR, max_size=40)
NASTY = st.sampled_from([
    -1, 0, 1, -(2 ** 63), 2 ** 63, 2 ** 64 + 1, 10 ** 30, -(10 ** 30), 10 ** 400, 1e308, -1e308,
    1.5, -0.0, 5e-324, float("nan"), float("inf"), float("-inf"), True, False, None, "", " ",
    "1", "true", "\x00", "\ud800", "\udfff\ud800", "\u202e", "\ufeff", "é" * 300, "x" * 5000,
    [], {}, [[[]]], [None], [1.5], [-1], [2 ** 70], {"include_usage": "yes"},
    {"include_usage": True, "x": 1}, ["a", 1], ["\ud800"], [""] * 5,
])
SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(-(2 ** 80), 2 ** 80)
           | st.floats() | TEXT)
JSON = st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=4)
                    | st.dictionaries(TEXT, kids, max_size=4), max_leaves=12)
VALUES = NASTY | JSON | st.integers(2, 200).map(lambda n: _nested(n))

COMMON = ["model", "max_tokens", "temperature", "top_p", "seed", "stop", "n", "stream",
          "stream_options", "ignore_eos", "user", "cache_salt"]
ROLES = ["system", "user", "assistant", "tool", "wizard", "", "\ud800", 7, None]


def _nested(depth: int):
  value = 1
  for i in range(depth):
    value = [value] if i % 2 else {"a": value}
  return value


MESSAGE = st.fixed_dictionaries(
    {}, optional={"role": st.sampled_from(ROLES) | VALUES,
                  "content": TEXT | VALUES
                  | st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image"])},
                                                   optional={"text": TEXT | VALUES}),
                             max_size=3),
                  "name": VALUES}) | VALUES


@st.composite
def bodies(draw, path: str):
  """A valid request with some fields replaced by wrong values, some dropped, some added."""
  if path == "/v1/chat/completions":
    body = {"model": MODEL, "messages": [{"role": "user", "content": "12"}], "max_tokens": 2}
    keys = COMMON + ["messages", "max_completion_tokens"]
  elif path == "/v1/completions":
    body = {"model": MODEL, "prompt": [7, 7, 7], "max_tokens": 2}
    keys = COMMON + ["prompt"]
  else:
    body, keys = {}, ["tenant"]
  for key in draw(st.lists(st.sampled_from(keys + ["logprobs", "", "\ud800", "x" * 3000]),
                           max_size=3)):
    if key == "messages":
      body[key] = draw(st.lists(MESSAGE, max_size=3) | VALUES)
    elif key == "prompt":
      body[key] = draw(TEXT | st.lists(st.integers(-5, 2000) | VALUES, max_size=6) | VALUES)
    elif key == "tenant":
      body[key] = draw(TEXT | st.sampled_from(["team-a", "team-b", "", "a/salt:x"]) | VALUES)
    else:
      body[key] = draw(VALUES | TEXT)
  for key in draw(st.lists(st.sampled_from(sorted(body) or [""]), max_size=2)):
    body.pop(key, None)
  return body


PATHS = ["/v1/completions", "/v1/chat/completions", "/v1/kv/flush"]
CONTENT_TYPES = st.sampled_from([
    None, "application/json", "application/json; charset=utf-8", "text/plain",
    "application/x-www-form-urlencoded", "multipart/form-data; boundary=xyz", "application/xml",
    "", "application/json; charset=utf-16", "*/*", "text/event-stream", "application/vnd.x+json",
])
RAW = st.one_of(
    st.binary(max_size=300),
    TEXT.map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.integers(1, 200_000).map(lambda n: b"[" * n + b"]" * n),
    st.integers(1, 5_000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
    st.integers(1, 200_000).map(lambda n: b"[" * n),
    st.integers(4_000, 6_000).map(lambda n: b'{"model": "fake", "prompt": [' + b"9" * n + b"]}"),
    st.integers(4_000, 6_000).map(lambda n: b'{"model": "fake", "max_tokens": 1' + b"0" * n
                                  + b"}"),
    st.sampled_from([
        b"", b" ", b"null", b"[]", b'"x"', b"1e999", b"NaN", b"-Infinity", b"{", b"}",
        b'{"model": "fake", "prompt": [7], "max_tokens": 1} trailing',
        b'\xef\xbb\xbf{"model": "fake", "prompt": [7]}',
        b'{"model": "fake", "prompt": "\\ud800"}',
        b'{"model": "fake", "prompt": [7], "cache_salt": "\\ud800"}',
        b'{"model": "fake", "prompt": [7], "\\udc80": 1}',
        b'{"model": "fake", "prompt": [7], "stop": ["\\udfff"]}',
        b'{"model": "fake", "prompt": [7], "user": "\\ud800"}',
        b'{"model": "\\ud800", "prompt": [7]}',
        b'{"tenant": "\\ud800"}', b'{"tenant": "a\\u0000b"}',
        b'{"model": "fake", "messages": [{"role": "user", "content": "\\ud800"}]}',
        b'{"model": "fake", "messages": [{"role": "\\ud800", "content": "1"}]}',
        b'{"model": "fake", "prompt": [7], "temperature": NaN}',
        b'{"model": "fake", "prompt": [7], "max_tokens": Infinity}',
        b'{"model": "fake", "prompt": [7], "seed": 1e400}',
        b'{"model": "fake", "prompt": [7], "model": "other"}',
        b'{"model": "fake", "prompt": [7], "max_tokens": 2}\x00',
        b"\xff\xfe{\x00}\x00", b"\xfe\xff\x00{\x00}",
        '{"model": "fake", "prompt": [7], "max_tokens": 2}'.encode("utf-16"),
        '{"model": "fake", "prompt": [7], "max_tokens": 2}'.encode("utf-32"),
        b"model=fake&prompt=7", b"--xyz\r\nContent-Disposition: form-data\r\n\r\n1\r\n--xyz--",
    ]),
)


# ---- the fuzz ---------------------------------------------------------------------------------

def test_json_bodies_with_wrong_values(servers):
  """Valid requests with fields replaced by wrong types, huge, negative, NaN and infinite
  numbers, unicode and control characters, lone surrogates, deep nesting; fields missing."""
  served, _ = servers

  @fuzz_settings(900)
  @given(st.sampled_from(PATHS).flatmap(lambda p: st.tuples(st.just(p), bodies(p))),
         st.sampled_from(["open", "open", "open", "keyed"]))
  def run(path_body, name):
    path, body = path_body
    _, client = served[name]
    data = json.dumps(body, allow_nan=True).encode()
    _check("json", client.post(path, content=data, headers={
        "Content-Type": "application/json", **_auth(name)}))

  run()
  _still_serving(servers)


def test_raw_bodies_and_content_types(servers):
  """Bytes that are not JSON, or barely: binary, truncated, deeply nested, over-long numbers,
  NaN literals, lone-surrogate escapes, a BOM, UTF-16/32, form data; any content type."""
  served, _ = servers

  @fuzz_settings(600)
  @given(st.sampled_from(PATHS), RAW, CONTENT_TYPES, st.sampled_from(["open", "keyed"]))
  def run(path, raw, content_type, name):
    _, client = served[name]
    headers = _auth(name) | ({} if content_type is None else {"Content-Type": content_type})
    _check("raw", client.post(path, content=raw, headers=headers))

  run()
  _still_serving(servers)


def test_oversized_bodies_with_and_without_a_length(servers):
  """Bodies around and over server.max_body_bytes, announced by Content-Length or streamed
  in chunks (no length): 413 in OpenAI's body, the connection kept answering."""
  served, _ = servers

  @fuzz_settings(150)
  @given(st.sampled_from(PATHS), st.integers(MAX_BODY - 64, 8 * MAX_BODY), st.booleans(),
         st.sampled_from([b" ", b"[", b"7,", b"\xff"]))
  def run(path, size, chunked, filler):
    _, client = served["open"]
    raw = (filler * size)[:size]
    content = iter([raw[i:i + 4096] for i in range(0, len(raw), 4096)]) if chunked else raw
    r = client.post(path, content=content, headers={"Content-Type": "application/json"})
    _check("oversized", r)
    if size > MAX_BODY:
      assert r.status_code == 413, r.text

  run()
  _still_serving(servers)


URL_TEXT = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF, categories=["L", "M",
                                 "N", "P", "S"], exclude_characters="#?%"), max_size=20)


def test_unknown_paths_methods_and_api_keys(servers):
  """Paths that do not exist (or nearly do), every method on the real ones, and
  Authorization headers that are not a valid key."""
  served, _ = servers
  # (h11 sends no header value with leading or trailing whitespace)
  auth = st.sampled_from([None, "Bearer key-a", "Bearer key-b", "Bearer", "bearer key-a",
                          "BEARER key-b", "Basic a2V5LWE6", "Bearer key-a x", "Bearer  key-a",
                          "Bearer " + "k" * 8000, "Bearer key-\x7f", "Bearer \tkey-a",
                          "Bearer key-\xe9", "Bearer\tkey-a"]) | st.text(
      st.characters(min_codepoint=32, max_codepoint=255), min_size=1, max_size=60).filter(
          lambda t: t == t.strip(" \t"))
  paths = (st.sampled_from(PATHS + ["/v1/models", "/metrics", "/health", "/", "/v1", "/v1/",
                                    "/v1/completions/", "/V1/completions", "/v1//completions",
                                    "/v1/completions/../models", "/v1/kv", "/v1/kv/flush/x",
                                    "/docs", "/openapi.json", "/redoc"])
           | URL_TEXT.map(lambda t: "/" + t.lstrip("/"))      # ("//x" would name a host)
           | URL_TEXT.map(lambda t: "/v1/" + t))

  @fuzz_settings(500)
  @given(paths, st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]),
         auth, st.sampled_from(["open", "keyed"]))
  def run(path, method, authorization, name):
    _, client = served[name]
    headers = {} if authorization is None else {"Authorization": authorization.encode("latin-1")}
    body = json.dumps(VALID).encode() if method in ("POST", "PUT", "PATCH") else None
    r = client.request(method, path, content=body, headers=headers)
    if method == "HEAD":      # no body to check: the status only
      SENT["paths", f"{r.status_code // 100}xx"] += 1
      assert r.status_code < 500
      return
    if path in ("/docs", "/openapi.json", "/redoc") and r.status_code == 200:
      SENT["paths", "2xx"] += 1
      return
    if path == "/metrics" and r.status_code == 200:
      SENT["paths", "2xx"] += 1
      return
    _check("paths", r)

  run()
  _still_serving(servers)


def test_the_fuzz_sent_at_least_2000_requests(servers):
  """(Runs after the fuzz above, in file order: the counts BENCHMARKS.md records.)"""
  total = sum(SENT.values())
  if total < 2000:
    pytest.skip(f"only {total} requests sent: run the whole file")
  assert not [k for k in SENT if k[1] == "5xx"]
