"""The event loop that serves a workload on a set of instances, on the run's clock.

    arrivals ─► admission (reject what can never fit) ─► router (least loaded)
                   │
                   ▼
    prefill queue of instance P_i ─► prefill step on P_i ─► first token
                                                             │
              colocated: the request stays on P_i and decodes there (prefill has priority)
              disaggregated: transfer queue ─► KV transfer P_i → D_j ─► decode batch of D_j
                                                             │
    decode batch of D_j ─► one decode step per loop turn (continuous batching) ─► EOS / length

Each instance has at most one step in flight. A loop turn dispatches a step on every idle
instance (JAX dispatch is asynchronous, so steps on different sub-meshes run at once), then
collects whichever steps are ready, blocking only when none is. Host logic only: instances are
passed in, so tests drive this loop with fake instances and a manual clock.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque

from pdjax.request import Request, Status
from pdjax.scheduler import batching
from pdjax.scheduler.router import least_loaded


POLL_S = 0.0002   # how often the loop checks in-flight steps when none is done


@dataclasses.dataclass(frozen=True)
class DriverOptions:
  token_budget: int          # prompt tokens per prefill step
  max_prefill_seqs: int      # sequences per prefill step
  max_decode_batch: int      # running sequences per decode instance
  max_model_len: int         # prompt + generated tokens per sequence
  pool_pages: int            # pages in each instance's pool
  page_size: int


@dataclasses.dataclass
class Step:
  kind: str                  # "prefill" | "decode"
  requests: list[Request]
  pending: object            # has ready() and result() -> list[int]


class Worker:
  """The driver's view of one instance: its queue, its running batch, its step in flight."""

  def __init__(self, instance, role: str):
    self.instance, self.role = instance, role
    self.waiting: deque[Request] = deque()
    self.running: list[Request] = []
    self.inflight: Step | None = None
    self.steps = {"prefill": 0, "decode": 0}

  @property
  def name(self) -> str:
    return self.instance.name

  @property
  def tables(self):
    return self.instance.tables

  def queued_tokens(self) -> int:
    return sum(r.prompt_len for r in self.waiting)


@dataclasses.dataclass
class RunResult:
  requests: list[Request]
  transfers: list[dict]
  duration_s: float
  steps: dict[str, dict[str, int]]


class Driver:

  def __init__(self, mode: str, workers: list[Worker], *, options: DriverOptions, clock,
               transfer_fn=None):
    if mode not in ("colocated", "disaggregated"):
      raise ValueError(f"mode must be colocated or disaggregated, got {mode!r}")
    self.mode, self.workers, self.opts, self.clock = mode, workers, options, clock
    self.transfer_fn = transfer_fn
    entry_role = "colocated" if mode == "colocated" else "prefill"
    self.entry = [w for w in workers if w.role == entry_role]
    self.decoders = [w for w in workers if w.role == "decode"]
    if not self.entry or (mode == "disaggregated" and (not self.decoders or not transfer_fn)):
      raise ValueError(f"{mode} needs {entry_role} instances"
                       + (", decode instances and a transfer function"
                          if mode == "disaggregated" else ""))
    self.transfer_queue: deque[tuple[Request, Worker]] = deque()
    self.transfers: list[dict] = []

  # ---- the loop ----------------------------------------------------------------------------

  def run(self, requests: list[Request], on_progress=None) -> RunResult:
    arrivals = deque(sorted(requests, key=lambda r: r.arrival_s))
    done = 0
    while True:
      self._admit(arrivals)
      self._start_transfers()
      for w in self.workers:
        if w.inflight is None:
          self._dispatch(w)
      inflight = [w for w in self.workers if w.inflight is not None]
      for w in self._wait_any(inflight):
        self._collect(w)
      finished = sum(r.status.terminal for r in requests)
      if on_progress and finished != done:
        on_progress(finished - done)
      done = finished
      if inflight:
        continue
      if arrivals:
        self.clock.sleep_until(arrivals[0].arrival_s)
        continue
      if done == len(requests):
        break
      self._fail_stalled(requests)   # nothing in flight, nothing to come: cannot progress
    steps = {w.name: dict(w.steps) for w in self.workers}
    return RunResult(requests, self.transfers, self.clock.now(), steps)

  def _wait_any(self, inflight: list[Worker]) -> list[Worker]:
    """The in-flight workers whose step is done, polling until at least one is. Polling (not
    blocking on one step) lets a short decode step be collected while a long prefill runs."""
    while inflight:
      ready = [w for w in inflight if w.inflight.pending.ready()]
      if ready:
        return ready
      time.sleep(POLL_S)
    return []

  def _admit(self, arrivals: deque[Request]) -> None:
    now = self.clock.now()
    o = self.opts
    while arrivals and arrivals[0].arrival_s <= now:
      req = arrivals.popleft()
      reason = batching.rejection_reason(req, max_model_len=o.max_model_len,
                                         token_budget=o.token_budget, pool_pages=o.pool_pages,
                                         page_size=o.page_size)
      if reason:
        req.finish(Status.REJECTED, now, reason)
        continue
      w = least_loaded(self.entry, lambda w: w.queued_tokens() + len(w.running))
      req.path = self.mode
      req.prefill_instance = w.name
      w.waiting.append(req)

  def _dispatch(self, w: Worker) -> None:
    max_seqs = self.opts.max_prefill_seqs
    if w.role == "colocated":   # prefilled requests decode here: keep room in the batch
      max_seqs = min(max_seqs, self.opts.max_decode_batch - len(w.running))
    if w.role in ("prefill", "colocated") and w.waiting and max_seqs > 0:
      batch = batching.take_prefill_batch(w.waiting, token_budget=self.opts.token_budget,
                                          max_seqs=max_seqs,
                                          admit=lambda r: self._allocate_for_prefill(w, r))
      if batch:
        now = self.clock.now()
        for r in batch:
          r.status, r.prefill_start_s = Status.PREFILLING, now
        seqs = [(r.prompt_ids, w.tables.block_table(r.id), r.sampling.temperature)
                for r in batch]
        self._launch(w, "prefill", batch, lambda: w.instance.prefill(seqs))
        return
    if w.role in ("decode", "colocated") and w.running:
      batch = list(w.running)
      seqs = [(r.output_ids[-1], r.prompt_len + len(r.output_ids) - 1,
               w.tables.block_table(r.id), r.sampling.temperature) for r in batch]
      self._launch(w, "decode", batch, lambda: w.instance.decode(seqs))

  def _allocate_for_prefill(self, w: Worker, r: Request) -> bool:
    # colocated: the request decodes here, so reserve its whole length now
    tokens = r.max_len if w.role == "colocated" else r.prompt_len
    if not w.tables.can_allocate(tokens):
      return False
    w.tables.allocate(r.id, tokens)
    return True

  def _launch(self, w: Worker, kind: str, batch: list[Request], call) -> None:
    try:
      w.inflight = Step(kind, batch, call())
      w.steps[kind] += 1
    except Exception as e:  # a failed step fails its requests, never the run
      self._fail_batch(w, batch, f"{kind} step failed on {w.name}: {type(e).__name__}: {e}")

  def _collect(self, w: Worker) -> None:
    step, w.inflight = w.inflight, None
    try:
      tokens = step.pending.result()
    except Exception as e:
      self._fail_batch(w, step.requests,
                       f"{step.kind} step failed on {w.name}: {type(e).__name__}: {e}")
      return
    now = self.clock.now()
    for r, token in zip(step.requests, tokens):
      if step.kind == "prefill":
        r.prefill_end_s = now
      if r.add_token(token, now):
        if r in w.running:
          w.running.remove(r)
        w.tables.free(r.id)
        r.finish(Status.FINISHED, now)
      elif step.kind == "prefill" and w.role == "colocated":
        r.status, r.decode_instance = Status.DECODING, w.name
        w.running.append(r)
      elif step.kind == "prefill":
        r.status = Status.TRANSFERRING
        self.transfer_queue.append((r, w))

  # ---- KV transfer (disaggregated) ---------------------------------------------------------

  def _start_transfers(self) -> None:
    while self.transfer_queue:
      r, src = self.transfer_queue[0]
      dst = least_loaded(
          self.decoders, lambda d: len(d.running) + (d.inflight is not None) * 0.5,
          eligible=lambda d: (len(d.running) < self.opts.max_decode_batch
                              and d.tables.can_allocate(r.max_len)))
      if dst is None:
        return   # decode tier full: the request waits (holding its prefill pages)
      self.transfer_queue.popleft()
      src_pages = src.tables.block_table(r.id)
      dst_pages = dst.tables.allocate(r.id, r.max_len)
      start = self.clock.now()
      try:
        result = self.transfer_fn(src.instance, src_pages, dst.instance,
                                  dst_pages[:len(src_pages)])
      except Exception as e:
        self.transfers.append({"bytes": 0, "seconds": self.clock.now() - start, "ok": False})
        src.tables.free(r.id)
        dst.tables.free(r.id)
        r.finish(Status.FAILED, self.clock.now(),
                 f"kv transfer {src.name}->{dst.name} failed: {type(e).__name__}: {e}")
        continue
      src.tables.free(r.id)
      r.transfer_bytes, r.transfer_s = result.bytes, result.seconds
      self.transfers.append({"bytes": result.bytes, "seconds": result.seconds, "ok": True})
      r.status, r.decode_instance = Status.DECODING, dst.name
      dst.running.append(r)

  # ---- failure paths -----------------------------------------------------------------------

  def _fail_batch(self, w: Worker, batch: list[Request], reason: str) -> None:
    now = self.clock.now()
    for r in batch:
      if r in w.running:
        w.running.remove(r)
      if r.id in w.tables.seq_ids:
        w.tables.free(r.id)
      r.finish(Status.FAILED, now, reason)

  def _fail_stalled(self, requests: list[Request]) -> None:
    now = self.clock.now()
    for w in self.workers:
      for r in list(w.waiting) + w.running:
        if r.id in w.tables.seq_ids:
          w.tables.free(r.id)
      w.waiting.clear()
      w.running.clear()
    for r, src in self.transfer_queue:
      src.tables.free(r.id)
    self.transfer_queue.clear()
    for r in requests:
      if not r.status.terminal:
        r.finish(Status.FAILED, now, "scheduler stalled: no step in flight and none possible")
