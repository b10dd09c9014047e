"""The OpenAI API as pdjax serves it: request bodies checked and turned into token ids and
sampling parameters, and the response / stream chunk bodies. Pure Python (no jax, no web
framework).

Supported: POST /v1/completions (`prompt`: a string, a list of token ids, or a one-element list
of either) and /v1/chat/completions (`messages` rendered with the checkpoint's chat template),
with `max_tokens` (chat: also `max_completion_tokens`), `temperature`, `top_p`, `seed`, `stop`
(a string or up to 4), `n` (1 only), `stream`, `stream_options.include_usage`, `user`, and
vLLM's `ignore_eos` and `cache_salt` (only requests with the same salt share prefix-cache
pages). With server.api_keys, the API key decides the tenant (its salt and KV quota). Any other parameter with a value is refused (400) by name: silently
ignoring it would make a comparison with another server wrong without saying so.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
import uuid

COMMON = {"model", "max_tokens", "temperature", "top_p", "seed", "stop", "n", "stream",
          "stream_options", "ignore_eos", "user", "cache_salt"}
MAX_CACHE_SALT_CHARS = 256
COMPLETION_KEYS = COMMON | {"prompt"}
CHAT_KEYS = COMMON | {"messages", "max_completion_tokens"}
DEFAULT_COMPLETION_TOKENS = 16      # OpenAI's (and vLLM's) default for /v1/completions
MAX_STOPS = 4
ROLES = ("system", "user", "assistant", "tool")


class ApiError(Exception):
  """A request the server refuses: HTTP status and a one-line message (OpenAI's error body)."""

  def __init__(self, status: int, message: str, param: str | None = None):
    super().__init__(message)
    self.status, self.message, self.param = status, message, param

  def body(self) -> dict:
    kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
            404: "not_found_error",
            405: "invalid_request_error", 409: "invalid_request_error",
            413: "invalid_request_error", 415: "invalid_request_error",
            429: "rate_limit_error", 503: "service_unavailable"}.get(self.status, "server_error")
    return {"error": {"message": self.message, "type": kind, "param": self.param,
                      "code": self.status}}


@dataclasses.dataclass
class Generation:
  """One checked request: what the engine runs and how the answer is shaped."""
  chat: bool
  prompt_ids: list[int]
  max_tokens: int
  temperature: float
  top_p: float
  seed: int | None
  stop: tuple[str, ...]
  stream: bool
  include_usage: bool
  ignore_eos: bool
  cache_salt: str = ""     # only requests with the same one share prefix-cache pages
  tenant: str = ""         # set by the server from the API key (server.api_keys)


def parse(body, *, chat: bool, model_name: str, tokenizer, max_model_len: int,
          vocab_size: int, max_prompt_chars: int | None = None) -> Generation:
  """Checks a request body; raises ApiError(400) naming the first problem. max_prompt_chars:
  text longer than this cannot fit in max_model_len tokens (max_prompt_chars_for) and is
  refused before it is tokenized or rendered."""
  if not isinstance(body, dict):
    raise ApiError(400, "the request body must be a JSON object")
  keys = CHAT_KEYS if chat else COMPLETION_KEYS
  for key, value in body.items():
    if key not in keys and value is not None:
      raise ApiError(400, f"unsupported parameter: {show(key)}", _cut(key))
  model = body.get("model")
  if model != model_name:
    raise ApiError(400, f"model {show(model)} is not served here (this server serves "
                   f"{model_name!r})", "model")
  n = body.get("n")
  if n is not None and not (_is_int(n) and n == 1):   # (not True, not 1.0)
    raise ApiError(400, f"n={show(n)} is not supported (only n=1)", "n")
  prompt_ids = (_chat_ids(body, tokenizer, max_prompt_chars) if chat
                else _prompt_ids(body, tokenizer, max_prompt_chars))
  if not prompt_ids:
    raise ApiError(400, "the prompt is empty", "messages" if chat else "prompt")
  bad = next((t for t in prompt_ids if not 0 <= t < vocab_size), None)
  if bad is not None:
    raise ApiError(400, f"prompt token id {show(bad)} is outside the vocabulary "
                   f"[0, {vocab_size})", "prompt")
  room = max_model_len - len(prompt_ids)
  if room < 1:
    raise ApiError(400, f"the prompt has {len(prompt_ids)} tokens; max_model_len = "
                   f"{max_model_len} leaves no room for an answer", "prompt")
  key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None \
      else "max_tokens"
  default = room if chat else min(DEFAULT_COMPLETION_TOKENS, room)
  max_tokens = _int(body, key, default, lo=1)
  if len(prompt_ids) + max_tokens > max_model_len:
    raise ApiError(400, f"prompt_len + {key} = {len(prompt_ids) + max_tokens} exceeds "
                   f"max_model_len = {max_model_len}", key)
  temperature = _number(body, "temperature", 1.0, lo=0.0, hi=2.0)
  top_p = _number(body, "top_p", 1.0, lo=0.0, hi=1.0)
  if top_p == 0.0:
    raise ApiError(400, "top_p must be in (0, 1]", "top_p")
  seed = body.get("seed")
  if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
    raise ApiError(400, f"seed={show(seed)} must be an integer", "seed")
  stream = _bool(body, "stream", False)
  options = body.get("stream_options")
  if options is not None and (not stream or not isinstance(options, dict)
                              or set(options) - {"include_usage"}
                              or not isinstance(options.get("include_usage", False), bool)):
    raise ApiError(400, "stream_options must be {\"include_usage\": bool}, with stream=true",
                   "stream_options")
  include_usage = (options or {}).get("include_usage", False)
  user = body.get("user")
  if user is not None and not isinstance(user, str):
    raise ApiError(400, f"user={show(user)} must be a string", "user")
  return Generation(chat=chat, prompt_ids=prompt_ids, max_tokens=max_tokens,
                    temperature=temperature, top_p=top_p, seed=seed, stop=_stops(body),
                    stream=stream, include_usage=include_usage,
                    ignore_eos=_bool(body, "ignore_eos", False), cache_salt=_cache_salt(body))


def max_prompt_chars_for(tokenizer, max_model_len: int) -> int | None:
  """The most characters a text prompt of max_model_len tokens can have: no token's text is
  longer than its vocabulary entry (byte-level entries spell a character with 1-4 symbols),
  so more characters than max_model_len x the longest entry need more tokens than fit."""
  vocab = getattr(tokenizer, "vocab_strings", None)
  if not vocab:
    return None
  return max_model_len * max(len(t) for t in vocab)


def _check_chars(n: int, max_prompt_chars: int | None, param: str) -> None:
  if max_prompt_chars is not None and n > max_prompt_chars:
    raise ApiError(400, f"the prompt has {n} characters, more than the {max_prompt_chars} "
                   f"that max_model_len tokens can hold", param)


def _prompt_ids(body: dict, tokenizer, max_prompt_chars: int | None = None) -> list[int]:
  prompt = body.get("prompt")
  if isinstance(prompt, list) and prompt and not all(_is_int(t) for t in prompt):
    if len(prompt) != 1:
      raise ApiError(400, f"one prompt per request (got {len(prompt)})", "prompt")
    prompt = prompt[0]
  if isinstance(prompt, str):
    if tokenizer is None:
      raise ApiError(400, "text prompts need a tokenizer; this server has none (send token "
                     "ids)", "prompt")
    _check_chars(len(prompt), max_prompt_chars, "prompt")
    return tokenizer.encode(prompt) if prompt else []
  if isinstance(prompt, list) and all(_is_int(t) for t in prompt):
    return list(prompt)
  raise ApiError(400, "prompt must be a string or a list of token ids", "prompt")


def _chat_ids(body: dict, tokenizer, max_prompt_chars: int | None = None) -> list[int]:
  messages = body.get("messages")
  if not isinstance(messages, list) or not messages:
    raise ApiError(400, "messages must be a non-empty list", "messages")
  plain = []
  for m in messages:
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
      raise ApiError(400, "each message must be an object with a role and content", "messages")
    if m["role"] not in ROLES:
      raise ApiError(400, f"message role {show(m['role'])} is not one of {', '.join(ROLES)}",
                     "messages")
    content = m.get("content")
    if isinstance(content, list):   # [{"type": "text", "text": ...}, ...]
      if not all(isinstance(p, dict) and p.get("type") == "text"
                 and isinstance(p.get("text"), str) for p in content):
        raise ApiError(400, "only text content parts are supported", "messages")
      content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
      raise ApiError(400, "message content must be a string or text parts", "messages")
    plain.append({"role": m["role"], "content": content})
  if tokenizer is None or tokenizer.chat_template is None:
    raise ApiError(400, "chat requests need a chat template; this server's model has none",
                   "messages")
  _check_chars(sum(len(m["content"]) for m in plain), max_prompt_chars, "messages")
  from pdjax.text.tokenizer import TextError
  try:
    return tokenizer.encode_chat(plain)
  except TextError as e:   # the template refused the chat (raise_exception): the client's error
    raise ApiError(400, str(e), "messages") from None


def _cache_salt(body: dict) -> str:
  salt = body.get("cache_salt")
  if salt is None:
    return ""
  if not isinstance(salt, str) or not 0 < len(salt) <= MAX_CACHE_SALT_CHARS:
    raise ApiError(400, f"cache_salt must be a non-empty string of at most "
                   f"{MAX_CACHE_SALT_CHARS} characters", "cache_salt")
  return salt


JSON_ERROR = "the request body is not valid JSON"
# A JSON escape of a UTF-16 surrogate: json.loads pairs a high one with a low one (one
# character, as json.dumps writes an emoji), and keeps a lone one as a str no codec can write.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def read_json(raw: bytes):
  """A request body's JSON value; ApiError(400) for what is not JSON or not text: bad syntax
  or encoding, nesting deeper than Python's recursion limit, an integer of more digits than
  Python reads (sys.get_int_max_str_digits), a lone surrogate (a str nothing can encode:
  the answer naming it, a page salt hashed from it, a tokenizer would fail on it)."""
  try:
    body = json.loads(raw)
  except RecursionError:
    raise ApiError(400, f"{JSON_ERROR}: it is nested too deeply") from None
  except ValueError as e:   # JSONDecodeError, UnicodeDecodeError, too many digits
    raise ApiError(400, f"{JSON_ERROR}: {_cut(str(e).split('; use sys.')[0], 200)}") from None
  if _SURROGATE_ESCAPE.search(raw):
    try:
      json.dumps(body, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, RecursionError):
      raise ApiError(400, f"{JSON_ERROR}: it holds a lone UTF-16 surrogate (an unpaired "
                     "\\ud800-\\udfff escape), which is not text") from None
  return body


def content_type_problem(content_type: str | None) -> ApiError | None:
  """415 for a body that says it is not JSON; none said (or empty), application/json and
  application/*+json (any parameters) are read as JSON."""
  media = (content_type or "").split(";")[0].strip().lower()
  if not media or media == "application/json" or (
      media.startswith("application/") and media.endswith("+json")):
    return None
  return ApiError(415, f"Content-Type {_cut(media, 100)} is not JSON: send application/json")


SALT_SEPARATOR = "/salt:"    # pdjax.kv.prefix_cache.salt_for: "tenant:<name>/salt:<cache_salt>"
MAX_TENANT_CHARS = 256


def tenant_problem(name: str, where: str = "") -> str | None:
  """Why `name` cannot be a tenant (None: it can); `where` follows the name in the message. Page salts are "tenant:<name>", narrowed
  by a request's cache_salt to "tenant:<name>/salt:<cache_salt>": a tenant named
  "a/salt:x" would share pages with tenant a's requests of cache_salt "x", and a's flush
  would wipe its pages. Printable: names go into kv_audit.jsonl and answers."""
  if not isinstance(name, str) or not 0 < len(name) <= MAX_TENANT_CHARS \
      or not name.isprintable():
    return (f"tenant {show(name)}{where} must be printable text of at most "
            f"{MAX_TENANT_CHARS} characters")
  if SALT_SEPARATOR in name:
    return (f"tenant {show(name)}{where} contains {SALT_SEPARATOR!r}, which separates a "
            "tenant from its requests' cache_salt")
  return None


class ApiKeys:
  """server.api_keys, as the server holds them: a SHA-256 digest per key (never the key) and
  its tenant. A presented key is hashed and compared with every digest by
  hmac.compare_digest, without stopping at a match: the time taken says nothing of how much
  of a guessed key is right, nor which key matched."""

  def __init__(self, keys: dict[str, str]):
    """keys: {key: tenant}; ValueError for an empty key or a tenant name tenant_problem
    refuses (naming the key by its place, never by itself)."""
    import hashlib
    if not isinstance(keys, dict) or not keys:
      raise ValueError("API keys must be a non-empty object of \"key\": \"tenant\" strings")
    self._digests = []
    for i, (key, tenant) in enumerate(keys.items(), 1):
      if not isinstance(key, str) or not key.strip() or key != key.strip():
        raise ValueError(f"key #{i} must be a non-empty string without surrounding spaces")
      problem = tenant_problem(tenant, f" (of key #{i})")
      if problem:
        raise ValueError(problem)
      self._digests.append((hashlib.sha256(key.encode()).digest(), tenant))

  def tenant(self, key: str) -> str | None:
    import hashlib
    import hmac
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
    found = None
    for known, tenant in self._digests:   # all of them, whatever matched
      if hmac.compare_digest(digest, known):
        found = tenant
    return found


def tenant_of(authorization: str | None, api_keys) -> str:
  """The tenant of the API key in an `Authorization: Bearer <key>` header (server.api_keys:
  an ApiKeys, or a {key: tenant} dict); ApiError(401) without a header or with a key not in
  api_keys."""
  if not isinstance(api_keys, ApiKeys):
    api_keys = ApiKeys(api_keys)
  scheme, _, key = (authorization or "").partition(" ")
  if scheme.lower() != "bearer" or not key.strip():
    raise ApiError(401, "this server needs an API key: Authorization: Bearer <key>")
  tenant = api_keys.tenant(key.strip())
  if tenant is None:
    raise ApiError(401, "the API key is not valid")
  return tenant


def load_api_keys(path: str) -> dict[str, str]:
  """server.api_keys: a JSON object {"<key>": "<tenant>", ...} (ApiKeys checks it);
  ValueError naming the file."""
  if not isinstance(path, str):   # (open(5) would read, then close, file descriptor 5)
    raise ValueError(f"server.api_keys={path!r} must be a file name")
  try:
    with open(path) as f:
      keys = json.load(f)
  except (OSError, ValueError, RecursionError) as e:
    raise ValueError(f"server.api_keys={path!r}: {e}") from None
  if not isinstance(keys, dict) or not keys or not all(
      isinstance(k, str) and k and isinstance(t, str) and t for k, t in keys.items()):
    raise ValueError(f"server.api_keys={path!r} must hold a JSON object of non-empty "
                     f"\"key\": \"tenant\" strings")
  try:
    ApiKeys(keys)
  except ValueError as e:
    raise ValueError(f"server.api_keys={path!r}: {e}") from None
  return keys


def _cut(text: str, limit: int = 100) -> str:
  return text if len(text) <= limit else text[:limit] + "..."


def show(value, limit: int = 100) -> str:
  """repr(value) for an error message, cut to about `limit` characters (a client's 4 MiB
  value is not echoed back)."""
  if isinstance(value, str) and len(value) > limit:
    r = repr(value[:limit])
    return f"{r[:-1]}...{r[-1]}"
  try:
    r = repr(value)
  except RecursionError:    # a deeply nested value
    return f"<a deeply nested {type(value).__name__}>"
  return r if len(r) <= limit else r[:limit] + "..."


def _stops(body: dict) -> tuple[str, ...]:
  stop = body.get("stop")
  if stop is None:
    return ()
  stops = [stop] if isinstance(stop, str) else stop
  if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) \
      or len(stops) > MAX_STOPS:
    raise ApiError(400, f"stop must be a non-empty string or a list of up to {MAX_STOPS}",
                   "stop")
  return tuple(stops)


def _is_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def _int(body: dict, key: str, default: int, lo: int) -> int:
  v = body.get(key)
  if v is None:
    return default
  if not _is_int(v) or v < lo:
    raise ApiError(400, f"{key}={show(v)} must be an integer >= {lo}", key)
  return v


def _number(body: dict, key: str, default: float, lo: float, hi: float) -> float:
  v = body.get(key)
  if v is None:
    return default
  if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
    raise ApiError(400, f"{key}={show(v)} must be a number in [{lo:g}, {hi:g}]", key)
  return float(v)


def _bool(body: dict, key: str, default: bool) -> bool:
  v = body.get(key)
  if v is None:
    return default
  if not isinstance(v, bool):
    raise ApiError(400, f"{key}={show(v)} must be true or false", key)
  return v


def refusal_status(reason: str, *, draining: bool) -> int:
  """The status of a request the scheduler rejected: 400 when it can never be served on this
  cluster (scheduler.batching's static checks: retrying cannot help), 503 when no instance can
  take it now (or the server drains), 429 for the transient rest (admission control, a tenant's
  KV quota), which a client should retry later."""
  from pdjax.scheduler.batching import is_permanent
  if draining or reason.startswith("no instance in the "):
    return 503
  return 400 if is_permanent(reason) else 429


# ---- responses ---------------------------------------------------------------------------------

def new_id(chat: bool) -> str:
  return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
  return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
          "total_tokens": prompt_tokens + completion_tokens}


def response(g: Generation, rid: str, model: str, text: str, finish_reason: str,
             completion_tokens: int, token_ids: list[int] | None = None) -> dict:
  """The whole (non-streamed) answer. token_ids (a server without a tokenizer): the
  generated ids, in the choice's "token_ids" (as vLLM's return_token_ids)."""
  base = {"id": rid, "created": int(time.time()), "model": model,
          "usage": usage(len(g.prompt_ids), completion_tokens)}
  extra = {} if token_ids is None else {"token_ids": token_ids}
  if g.chat:
    return {**base, "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "logprobs": None, "finish_reason": finish_reason, **extra}]}
  return {**base, "object": "text_completion",
          "choices": [{"index": 0, "text": text, "logprobs": None,
                       "finish_reason": finish_reason, **extra}]}


def chunk(g: Generation, rid: str, model: str, text: str | None,
          finish_reason: str | None = None, first: bool = False,
          token_ids: list[int] | None = None) -> dict:
  """One streamed chunk: a piece of text and/or the finish reason (chat's first chunk also
  carries the assistant role; token_ids: see `response`)."""
  base = {"id": rid, "created": int(time.time()), "model": model}
  extra = {} if token_ids is None else {"token_ids": token_ids}
  if g.chat:
    delta = {"role": "assistant"} if first else {}
    if text is not None:
      delta["content"] = text
    return {**base, "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "logprobs": None,
                         "finish_reason": finish_reason, **extra}]}
  return {**base, "object": "text_completion",
          "choices": [{"index": 0, "text": text or "", "logprobs": None,
                       "finish_reason": finish_reason, **extra}]}


def usage_chunk(g: Generation, rid: str, model: str, completion_tokens: int) -> dict:
  return {"id": rid, "created": int(time.time()), "model": model,
          "object": "chat.completion.chunk" if g.chat else "text_completion", "choices": [],
          "usage": usage(len(g.prompt_ids), completion_tokens)}
