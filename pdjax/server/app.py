"""The HTTP endpoints (FastAPI): /v1/completions, /v1/chat/completions (whole answers or SSE
streams of `data: {...}` chunks ending with `data: [DONE]`), /v1/models, /health, /metrics.

Status codes, every one with OpenAI's error body {"error": {"message", "type", "param",
"code"}}: 400 for a request the server refuses to run (bad JSON, an unknown parameter, model or
role, a chat template that refuses the messages, an empty or over-long prompt: protocol.py;
one the cluster can never serve), 401 without a valid API key (server.api_keys: /v1/ and
/metrics, unless server.metrics_public), 409 for a tenant's flush of a cache every tenant
shares (kv.shared_salt), 413 for a body over max_body_bytes, 429 when admission
control or a tenant's quota rejects it for now (the reason as the message), 503 while the
server starts or drains or when no instance can take it, 500 when the engine failed the
request or stopped (the reason). /health: 200 {"status": "ok"} once ready; 503 "starting"
(with the stage, and programs compiled of all) before, 503 "draining" / "stopped" after a
signal; 500 "failed" with the error once the driver thread (or the engine process) died. A
client that disconnects (mid-stream, or while waiting for a whole answer) has its request
cancelled at once: its pages are freed on every tier.

`engine` is a DriverBridge (the driver in this process: the tests' fake engines) or an
EngineClient (pdjax.serve: the driver in the engine-core process); both give the same
interface (engine_api.py).
"""

from __future__ import annotations

import asyncio
import json

from fastapi import FastAPI, Request as HttpRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from pdjax.request import Status
from pdjax.server import protocol
from pdjax.server.engine_api import Draining, EngineStopped, SharedCache, error_text

DISCONNECT_POLL_S = 0.5   # a non-streaming request checks for its client this often
MAX_BODY_BYTES = 4 * 1024 * 1024   # server.max_body_bytes' default: a larger body gets 413


async def read_body(http: HttpRequest, limit: int) -> bytes:
  """The request body, refused (413) as soon as it is known to pass `limit` bytes: from its
  Content-Length, else while it streams in (never held whole beyond the limit)."""
  too_big = protocol.ApiError(413, f"the request body is larger than {limit} bytes "
                              f"(server.max_body_bytes)")
  length = http.headers.get("content-length", "")
  if length.isdigit() and int(length) > limit:
    raise too_big
  chunks, size = [], 0
  async for piece in http.stream():
    size += len(piece)
    if size > limit:
      raise too_big
    chunks.append(piece)
  return b"".join(chunks)


async def read_json_body(http: HttpRequest, limit: int) -> bytes:
  """read_body, refused first (415) when its Content-Type says it is not JSON."""
  wrong = protocol.content_type_problem(http.headers.get("content-type"))
  if wrong is not None:
    raise wrong
  return await read_body(http, limit)


def make_app(engine, *, model_name: str, max_model_len: int, vocab_size: int,
             metrics=None, lifespan=None, max_body_bytes: int = MAX_BODY_BYTES,
             api_keys: dict[str, str] | None = None,
             metrics_public: bool = False) -> FastAPI:
  """api_keys: {key: tenant} (server.api_keys; ValueError for a tenant name
  protocol.tenant_problem refuses); when given, /v1/ and /metrics requests without a valid
  `Authorization: Bearer` key get 401, and the key's tenant salts and bounds the request.
  The keys are held hashed (protocol.ApiKeys). metrics_public (server.metrics_public):
  /metrics answers without a key. metrics: an in-process engine's ServerMetrics for /metrics
  (default: the engine's own)."""
  api_keys = protocol.ApiKeys(api_keys) if api_keys else None
  # No redirect of /v1/completions/ to /v1/completions (a 307 a POST may not follow): 404.
  app = FastAPI(title="pdjax", lifespan=lifespan, redirect_slashes=False)
  max_prompt_chars = protocol.max_prompt_chars_for(engine.tokenizer, max_model_len)

  def error(e: protocol.ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)

  @app.exception_handler(StarletteHTTPException)
  async def http_error(_, e: StarletteHTTPException):   # unknown route, wrong method: OpenAI's
    return error(protocol.ApiError(e.status_code, str(e.detail)))   # error body, not FastAPI's

  @app.exception_handler(Exception)
  async def server_error(_, e: Exception):   # a bug: answered in OpenAI's shape, then re-raised
    return error(protocol.ApiError(500, f"internal error: {type(e).__name__}: {e}"))

  @app.get("/health")
  async def health():
    if engine.error is not None:   # the driver thread died (logged with its traceback)
      return JSONResponse({"status": "failed", "error": error_text(engine.error)}, 500)
    if engine.draining or not engine.alive:
      return JSONResponse({"status": "draining" if engine.alive else "stopped"}, 503)
    if not engine.ready:           # loading, compiling: {"status": "starting", "stage", ...}
      return JSONResponse(engine.startup.describe(), 503)
    return {"status": "ok"}

  @app.get("/v1/models")
  async def models(http: HttpRequest):
    if api_keys:
      try:
        protocol.tenant_of(http.headers.get("authorization"), api_keys)
      except protocol.ApiError as e:
        return error(e)
    return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                        "owned_by": "pdjax", "max_model_len": max_model_len}]}

  @app.get("/metrics")
  async def prometheus(http: HttpRequest):
    try:
      if api_keys and not metrics_public:   # the load, queues and tenants' traffic it shows
        protocol.tenant_of(http.headers.get("authorization"), api_keys)
      body, content_type = await engine.metrics_text(metrics)
    except EngineStopped as e:
      return error(protocol.ApiError(503, str(e)))
    except protocol.ApiError as e:
      return error(e)
    return Response(body, media_type=content_type)

  async def generate(http: HttpRequest, chat: bool):
    arrival_s = engine.clock.now()    # on receipt: parsing and tokenizing count as queue time
    try:
      tenant = (protocol.tenant_of(http.headers.get("authorization"), api_keys)
                if api_keys else "")
      body = protocol.read_json(await read_json_body(http, max_body_bytes))
      # Tokenizing and rendering a template take time: off the event loop, which serves
      # every other stream meanwhile.
      g = await asyncio.to_thread(
          protocol.parse, body, chat=chat, model_name=model_name, tokenizer=engine.tokenizer,
          max_model_len=max_model_len, vocab_size=vocab_size, max_prompt_chars=max_prompt_chars)
      g.tenant = tenant
      if g.stop and engine.tokenizer is None:
        raise protocol.ApiError(400, "stop strings need a tokenizer; this server has none",
                                "stop")
      rid = protocol.new_id(chat)
      queue: asyncio.Queue = asyncio.Queue()
      try:
        req = engine.submit(rid, g, queue, arrival_s=arrival_s)
      except Draining as e:
        raise protocol.ApiError(503, str(e)) from None
      except EngineStopped as e:
        raise protocol.ApiError(500, str(e)) from None
    except protocol.ApiError as e:
      return error(e)
    first = await _next_event(engine, http, req, queue)
    refused = _refusal(engine, first[1]) if first[0] == "end" else None
    if refused is not None:                    # rejected or failed before any text: a status
      return JSONResponse(refused.body(), status_code=refused.status)
    if first[0] in ("error", "refused"):       # the engine stopped / took no more requests
      status = 500 if first[0] == "error" else 503
      return JSONResponse(protocol.ApiError(status, first[1]).body(), status_code=status)
    if g.stream:
      return StreamingResponse(_stream(engine, g, rid, req, first, queue, model_name),
                               media_type="text/event-stream",
                               headers={"Cache-Control": "no-cache"})
    return await _whole(engine, http, g, rid, req, first, queue, model_name)

  @app.post("/v1/kv/flush")
  async def kv_flush(http: HttpRequest):
    """Deletes a tenant's KV: its pages (and its cache_salts') in every device cache and every
    node's host tier, audited in kv_audit.jsonl; nothing of it can be reused after. With
    server.api_keys the key names the tenant (a body "tenant" must be the same); without,
    the body's "tenant" ("" by default: requests without a key). Answers {"tenant", "pages"};
    409 under kv.shared_salt (no page is the tenant's own: engine_api.SharedCache)."""
    try:
      own = protocol.tenant_of(http.headers.get("authorization"), api_keys) if api_keys else None
      raw = await read_json_body(http, max_body_bytes)
      body = protocol.read_json(raw) if raw.strip() else {}
      asked = body.get("tenant") if isinstance(body, dict) else None
      if asked is not None and not isinstance(asked, str):
        raise protocol.ApiError(400, f"tenant must be a string, got {protocol.show(asked)}",
                                "tenant")
      if asked and (problem := protocol.tenant_problem(asked)):   # no key file could hold it
        raise protocol.ApiError(400, problem, "tenant")
      if own is not None and asked not in (None, own):
        raise protocol.ApiError(403, "an API key may flush only its own tenant's KV", "tenant")
      tenant = own if own is not None else (asked or "")
      if engine.error is not None or not engine.alive:
        raise protocol.ApiError(503, "the engine is not running")
      pages = await engine.flush_tenant(tenant)
    except SharedCache as e:
      return error(protocol.ApiError(409, str(e)))
    except EngineStopped as e:
      return error(protocol.ApiError(503, str(e)))
    except protocol.ApiError as e:
      return error(e)
    return {"object": "kv.flush", "tenant": tenant, "pages": pages}

  @app.post("/v1/completions")
  async def completions(http: HttpRequest):
    return await generate(http, chat=False)

  @app.post("/v1/chat/completions")
  async def chat_completions(http: HttpRequest):
    return await generate(http, chat=True)

  return app


def _refusal(engine, outcome) -> protocol.ApiError | None:
  """Why an ended request (engine_api.Outcome) got no answer (None: it finished, or the
  shutdown cancelled it: it is answered with what it has and finish_reason "abort", as vLLM
  does)."""
  status, reason = outcome.status, outcome.reason
  if status is Status.FINISHED or (status is Status.CANCELLED and engine.draining):
    return None
  if status is Status.REJECTED:   # never servable 400, for now 429, no capacity 503
    return protocol.ApiError(protocol.refusal_status(reason, draining=engine.draining), reason)
  if status is Status.CANCELLED:
    return protocol.ApiError(503 if engine.draining else 499, reason)
  return protocol.ApiError(500, reason or f"request {status.value}")


def _finish_reason(outcome, stopped: bool) -> str:
  return "stop" if stopped else (outcome.finish_reason or "length")


async def _next_event(engine, http, req, queue):
  """The request's next event; meanwhile a client that went away cancels it, and so does a
  handler cancelled while it waits (the server forced to stop)."""
  while True:
    try:
      return await asyncio.wait_for(queue.get(), DISCONNECT_POLL_S)
    except asyncio.TimeoutError:
      if await http.is_disconnected():
        engine.cancel(req)
    except asyncio.CancelledError:
      engine.cancel(req)
      raise


async def _whole(engine, http, g, rid, req, first, queue, model_name):
  pieces, ids, event = [], [], first
  while True:
    if event is None:
      event = await _next_event(engine, http, req, queue)
    if event[0] == "text":
      pieces.append(event[1])
      ids += event[3] or []
      event = None
    elif event[0] == "error":
      return JSONResponse(protocol.ApiError(500, event[1]).body(), status_code=500)
    else:
      _, outcome, stopped = event
      refused = _refusal(engine, outcome)
      if refused is not None:
        return JSONResponse(refused.body(), status_code=refused.status)
      text = "".join(pieces)
      reason = ("abort" if outcome.status is Status.CANCELLED
                else _finish_reason(outcome, stopped))
      return protocol.response(g, rid, model_name, text, reason, len(outcome.output_ids),
                               token_ids=ids or None)


async def _stream(engine, g, rid, req, event, queue, model_name):
  """SSE: the first chunk carries the request id (chat: and the role) as soon as the first
  text is known; then a chunk per piece of text, the finish reason ("abort": cancelled by the
  shutdown), usage if asked, [DONE]. A request that ends without an answer streams one error
  object."""
  first, done = True, False
  try:
    while True:
      event = event or await queue.get()
      if event[0] == "text":
        yield _sse(protocol.chunk(g, rid, model_name, event[1], first=first,
                                  token_ids=event[3]))
        first, event = False, None
        continue
      done = True
      if event[0] == "error":
        yield _sse(protocol.ApiError(500, event[1]).body())
        break
      _, outcome, stopped = event
      refused = _refusal(engine, outcome)
      if refused is not None:
        yield _sse(refused.body())
        break
      reason = ("abort" if outcome.status is Status.CANCELLED
                else _finish_reason(outcome, stopped))
      yield _sse(protocol.chunk(g, rid, model_name, "" if first else None, reason,
                                first=first))
      if g.include_usage:
        yield _sse(protocol.usage_chunk(g, rid, model_name, len(outcome.output_ids)))
      break
    yield "data: [DONE]\n\n"
  finally:
    if not done:              # the client went away (the response was cancelled)
      engine.cancel(req)


def _sse(obj: dict) -> str:
  return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
