"""What the HTTP fuzz (test_server_fuzz.py, issue 47 item 12) found, one regression test each,
with the exact answer: each was a 500 (or a dead server, or a huge or odd answer) before.
Fake instances, the prefix cache on, no model."""

import json

import pytest
from fastapi.testclient import TestClient

from test_server_auth import MODEL, _serving


@pytest.fixture
def client():
  with _serving() as (engine, client):
    yield engine, client


def _refused(r, status: int, message: str, param=None):
  assert r.status_code == status and r.headers["content-type"] == "application/json", (
      r.status_code, r.text[:300])
  kind = {400: "invalid_request_error", 404: "not_found_error", 415: "invalid_request_error"}
  assert r.json() == {"error": {"message": message, "type": kind[status], "param": param,
                                "code": status}}


def _still_serves(engine, client):
  r = client.post("/v1/completions", json={"model": MODEL, "prompt": [7] * 5, "max_tokens": 3})
  assert r.status_code == 200 and r.json()["choices"][0]["text"] == "567", r.text
  assert engine.error is None and client.get("/health").json() == {"status": "ok"}


SURROGATE = ("the request body is not valid JSON: it holds a lone UTF-16 surrogate (an "
             "unpaired \\ud800-\\udfff escape), which is not text")


@pytest.mark.parametrize("raw", [
    b'{"model": "fake", "prompt": [7], "\\ud800": 1}',                  # was a 500: the param
    b'{"model": "fake", "prompt": [1,2,3,4,5,6,7,8,9], "cache_salt": "\\ud800"}',  # killed
    b'{"model": "fake", "prompt": "\\udfff"}',                         # the driver thread
    b'{"model": "fake", "prompt": [7], "stop": ["a\\udc80"]}',
    b'{"model": "fake", "prompt": [7], "user": "\\ud800\\ud800"}',
], ids=["param", "cache-salt", "prompt", "stop", "user"])
def test_a_lone_surrogate_is_400_and_the_driver_lives(client, raw):
  """JSON may escape a lone surrogate (\\ud800); Python reads it into a str that cannot be
  encoded: the error answer naming the parameter failed to encode (500), and a cache_salt
  holding one killed the driver thread as it hashed the page names (every later request a
  500, /health "failed")."""
  engine, client = client
  _refused(client.post("/v1/completions", content=raw), 400, SURROGATE)
  _still_serves(engine, client)


def test_a_surrogate_pair_is_text(client):
  """(What json.dumps writes for an emoji: a pair, one character once read.)"""
  engine, client = client
  r = client.post("/v1/completions", content=b'{"model": "fake", "prompt": [7, 7, 7, 7, 7], '
                  b'"max_tokens": 3, "cache_salt": "\\ud83d\\ude00"}')
  assert r.status_code == 200, r.text


@pytest.mark.parametrize("raw,message", [
    (b"[" * 100_000 + b"]" * 100_000,
     "the request body is not valid JSON: it is nested too deeply"),
    (b'{"a":' * 5_000 + b"1" + b"}" * 5_000,
     "the request body is not valid JSON: it is nested too deeply"),
    (b'{"model": "fake", "prompt": [' + b"9" * 5_000 + b"]}",
     "the request body is not valid JSON: Exceeds the limit (4300 digits) for integer string "
     "conversion: value has 5000 digits"),
], ids=["deep-list", "deep-object", "long-number"])
def test_json_python_cannot_read_is_400(client, raw, message):
  """A body nested deeper than Python's recursion limit (RecursionError) or with an integer of
  more than 4,300 digits (a ValueError, not a JSONDecodeError) was a 500, and the connection
  it came on was dropped."""
  engine, client = client
  for path in ("/v1/completions", "/v1/chat/completions", "/v1/kv/flush"):
    _refused(client.post(path, content=raw), 400, message)
  _still_serves(engine, client)


def test_refusals_do_not_echo_a_huge_value(client):
  """A 3,000-character parameter name or value was echoed whole in the message (and a 4 MiB
  one would have been): now cut to 100 characters."""
  engine, client = client
  key = "x" * 3000
  r = client.post("/v1/completions", json={"model": MODEL, "prompt": [7], key: 1})
  _refused(r, 400, f"unsupported parameter: '{'x' * 100}...'", "x" * 100 + "...")
  r = client.post("/v1/completions", json={"model": MODEL, "prompt": [7], "stream": "y" * 3000})
  _refused(r, 400, f"stream='{'y' * 100}...' must be true or false", "stream")
  r = client.post("/v1/completions", json={"model": "m" * 3000, "prompt": [7]})
  _refused(r, 400, f"model '{'m' * 100}...' is not served here (this server serves 'fake')",
           "model")
  r = client.post("/v1/completions", json={"model": MODEL, "prompt": [7], "seed": [[1] * 3000]})
  _refused(r, 400, f"seed={repr([[1] * 3000])[:100]}... must be an integer", "seed")
  r = client.post("/v1/completions", content=b'{"model": "fake", "prompt": [1' + b"0" * 4000
                  + b"]}")
  _refused(r, 400, f"prompt token id 1{'0' * 99}... is outside the vocabulary [0, 1000)",
           "prompt")
  _still_serves(engine, client)


@pytest.mark.parametrize("content_type", [
    "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=xyz",
    "application/xml"])
def test_a_body_that_says_it_is_not_json_is_415(client, content_type):
  """A body sent as another media type was parsed as JSON anyway (and run, when it happened
  to be JSON). Without a Content-Type, or with application/json, application/*+json (any
  parameters), it is read as JSON."""
  engine, client = client
  body = json.dumps({"model": MODEL, "prompt": [7] * 5, "max_tokens": 3})
  for path in ("/v1/completions", "/v1/chat/completions", "/v1/kv/flush"):
    r = client.post(path, content=body, headers={"Content-Type": content_type})
    _refused(r, 415, f"Content-Type {content_type.split(';')[0]} is not JSON: send "
             "application/json")
  for content_type in (None, "application/json", "application/json; charset=utf-8",
                       "application/vnd.api+json", "Application/JSON"):
    headers = {} if content_type is None else {"Content-Type": content_type}
    assert client.post("/v1/completions", content=body, headers=headers).status_code == 200
  _still_serves(engine, client)


def test_a_trailing_slash_is_404_not_a_redirect(client):
  """Starlette redirected /v1/completions/ (307) to /v1/completions: an answer that is not
  OpenAI's, and a POST a client may not follow."""
  _, client = client
  r = client.post("/v1/completions/", json={"model": MODEL, "prompt": [7]},
                  follow_redirects=False)
  _refused(r, 404, "Not Found")


@pytest.mark.parametrize("extra,message,param", [
    ({"stream": True, "stream_options": {"include_usage": "yes"}},
     "stream_options must be {\"include_usage\": bool}, with stream=true", "stream_options"),
    ({"user": 7}, "user=7 must be a string", "user"),
    ({"user": ["a"]}, "user=['a'] must be a string", "user"),
    ({"n": True}, "n=True is not supported (only n=1)", "n"),
    ({"n": 1.0}, "n=1.0 is not supported (only n=1)", "n"),
], ids=["include-usage", "user-int", "user-list", "n-bool", "n-float"])
def test_wrong_types_that_were_taken_are_400(client, extra, message, param):
  """Values of the wrong type were read as something else ("yes" as true; n=True and n=1.0
  as 1; any user)."""
  _, client = client
  r = client.post("/v1/completions", json={"model": MODEL, "prompt": [7], **extra})
  _refused(r, 400, message, param)
