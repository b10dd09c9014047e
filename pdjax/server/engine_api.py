"""What the HTTP handlers see of an engine, whether it runs in their process (DriverBridge) or
in the engine-core process (EngineClient): the refusals they turn into statuses, the outcome
of an ended request, and how an engine's error reads. Pure Python.

Events a handler's queue receives, in order: ("text", piece, tokens so far, token ids or
None) for each piece of text (without a tokenizer the pieces are empty and carry the token
ids: the chunks' "token_ids"), then one of ("end", Outcome, ended by a stop string),
("error", reason) (the engine stopped: 500) or ("refused", reason) (the engine took no more
requests when this one reached it: 503).
"""

from __future__ import annotations

import dataclasses
import time

from pdjax.request import Status

# Both processes hand the GIL over every 0.5 ms, not Python's default 5 ms: in the HTTP
# process a batch of tokens reaches its streams without waiting out a busy event loop, in the
# engine process a submission is taken without waiting out the driver's Python.
SWITCH_INTERVAL_S = 0.0005


class PlanError(Exception):
  """The engine process cannot serve this configuration (pdjax.serve: "config error: ...")."""


class Draining(Exception):
  """The server is shutting down (or still starting): no new request is taken (503)."""


class EngineStopped(Exception):
  """The engine stopped (its driver thread or its process died): no request can be served
  any more (500)."""


class SharedCache(Exception):
  """A tenant's flush refused: kv.shared_salt names every tenant's pages under one salt, so
  none is the tenant's own, and flushing them would wipe every tenant's cache (409)."""
  MESSAGE = ("kv.shared_salt is set: every tenant's prefix-cache pages are shared, so one "
             "tenant's cannot be flushed without wiping everyone's")


class RemoteError(Exception):
  """An error raised in the engine-core process, as the HTTP process knows it: the name of
  its type (`kind`) and its message."""

  def __init__(self, kind: str, message: str):
    super().__init__(message)
    self.kind = kind


def error_text(e: BaseException) -> str:
  """"ZeroDivisionError: a bug in the decode step": the error's type (a RemoteError's kind)
  and message, as /health and the 500 answers say it."""
  return f"{getattr(e, 'kind', type(e).__name__)}: {e}"


def stopped_reason(e: BaseException) -> str:
  """Why requests fail once the engine stopped (their 500's message and requests.jsonl's
  reason)."""
  return f"the engine stopped: {error_text(e)}"


class SharedWallClock:
  """A wall clock (seconds) whose zero is t0, a time.perf_counter() reading: perf_counter is
  the machine's monotonic clock, the same in every process, so the HTTP process stamps
  arrivals on the engine process's run clock."""

  def __init__(self, t0: float):
    self.t0 = t0

  def now(self) -> float:
    return time.perf_counter() - self.t0

  def sleep_until(self, t: float) -> None:
    delay = t - self.now()
    if delay > 0:
      time.sleep(delay)


@dataclasses.dataclass(frozen=True)
class Outcome:
  """An ended request, as its handler answers it (sent across processes: plain data)."""
  id: str
  status: Status
  reason: str
  finish_reason: str | None
  output_ids: tuple[int, ...]

  @classmethod
  def of(cls, req) -> "Outcome":
    return cls(req.id, req.status, req.reason, req.finish_reason, tuple(req.output_ids))
