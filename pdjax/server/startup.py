"""What a starting server is doing, for its stderr and its /health: loading weights, then
compiling N of M programs, then ready. Pure Python; thread-safe (the engine's thread reports,
the HTTP loop reads; in the engine-core process each change is also handed to `watch`, which
sends it to the HTTP process's StartupMirror).

  startup: loading weights (checkpoint /models/smollm2)
  startup: loading weights done in 1.2 s
  startup: compiling programs
  startup: compiling programs 1/44 (prefill-0 prefill, 64 tokens)
  startup: compiling programs 9/44 (prefill-0 KV gather, 16 pages to tp=2)   (a line a second)
  ...
  startup: compiling programs 44/44 (KV route prefill-1 -> decode-1)
  startup: ready in 38.5 s
"""

from __future__ import annotations

import sys
import threading
import time


SAY_EVERY_S = 1.0


class StartupCancelled(Exception):
  """A shutdown signal came while the server was starting."""


class Startup:

  def __init__(self, out=None, cancelled=lambda: False, watch=None):
    """out: where progress lines go (default: sys.stderr at each write); cancelled(): checked
    at each step (True: the step raises StartupCancelled); watch(describe(), ready): called
    after each change (default: nobody)."""
    self._out, self.cancelled, self._watch = out, cancelled, watch
    self._lock = threading.Lock()
    self._t0 = self._stage_t0 = time.monotonic()
    self.stage, self.done, self.total, self.ready = "starting", 0, 0, False
    self._said = float("-inf")   # when the last program line was printed

  def _say(self, line: str) -> None:
    out = self._out or sys.stderr
    print(f"startup: {line}", file=out, flush=True)

  def begin(self, stage: str, detail: str = "") -> None:
    if self.cancelled():
      raise StartupCancelled(stage)
    with self._lock:
      self.stage, self.done, self.total = stage, 0, 0
      self._stage_t0 = time.monotonic()
    self._changed()
    self._say(f"{stage} ({detail})" if detail else stage)

  def end(self) -> None:
    self._say(f"{self.stage} done in {time.monotonic() - self._stage_t0:.1f} s")

  def program(self, done: int, total: int, what: str) -> None:
    """engine.cluster.build_instances' progress callback."""
    if self.cancelled():
      raise StartupCancelled(self.stage)
    with self._lock:
      self.stage, self.done, self.total = "compiling programs", done, total
    self._changed()
    now = time.monotonic()
    if done == total or now - self._said >= SAY_EVERY_S:   # a line a second at most
      self._said = now
      self._say(f"compiling programs {done}/{total} ({what})")

  def finished(self) -> None:
    with self._lock:
      self.stage, self.ready = "ready", True
    self._changed()
    self._say(f"ready in {time.monotonic() - self._t0:.1f} s")

  def _changed(self) -> None:
    if self._watch is not None:
      self._watch(self.describe(), self.ready)

  def describe(self) -> dict:
    """/health's body while starting."""
    with self._lock:
      return describe_progress(self.stage, self.done, self.total)

  def waiting_message(self) -> str:
    """The 503's message of a request that came too early."""
    return waiting_message(self.describe())


def describe_progress(stage: str, done: int = 0, total: int = 0) -> dict:
  body = {"status": "starting", "stage": stage}
  if total:
    body.update(done=done, total=total)
  return body


def waiting_message(progress: dict) -> str:
  """"the server is starting (compiling programs 2/3)", from /health's starting body."""
  stage = progress.get("stage", "starting")
  if "total" in progress:
    stage += f" {progress['done']}/{progress['total']}"
  return f"the server is starting ({stage})"


class StartupMirror:
  """The HTTP process's copy of the engine-core process's Startup (for /health and the 503s
  of early requests): the latest describe() it sent. Thread-safe (the link's reader thread
  updates it)."""

  def __init__(self):
    self._body = describe_progress("starting")
    self.ready = False

  def update(self, body: dict, ready: bool) -> None:
    self._body, self.ready = dict(body), ready

  def describe(self) -> dict:
    return dict(self._body)

  def waiting_message(self) -> str:
    return waiting_message(self._body)
