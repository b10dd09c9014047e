"""The driver's view of one instance: its queue, its running batch, its step in flight, and the
load signals policies read. Pure Python.

A decode slot is held from the moment it is promised, not from when the request starts
decoding: `reserved` holds the requests admitted to prefill here that will decode here and the
KV transfers dispatched here that have not landed. `num_running()` counts them, so routers,
admission and step policies never promise a slot twice, and running + reserved never exceeds
`max_batch` (the largest decode bucket; `Driver.check_invariants` checks it).
"""

from __future__ import annotations

import dataclasses
from collections import deque

from pdjax.request import Request
from pdjax.scheduler.records import SAMPLE_STATE

EWMA = 0.3   # weight of the newest measurement in the measured rates


@dataclasses.dataclass
class Step:
  plan: object                # policies.StepPlan
  pending: object             # has ready() and result() -> list[int]
  start_s: float              # dispatched; for a step dispatched ahead, moved to when the
                              # step before it was collected (when its device work began)
  kind: str                   # "prefill" | "decode" | "mixed"
  plan_s: float = 0.0         # host seconds: the step policy's plan and page bookkeeping
  dispatch_s: float = 0.0     # host seconds: building the metadata and launching the program
  ahead: bool = False         # dispatched before the previous step's tokens reached the host
  dispatched_s: float = 0.0   # when its launch returned (start_s may move later: see above)
  streams: list = dataclasses.field(default_factory=list)   # (request, decode worker, skip):
                              # prompts whose KV streams while it runs (scheduler/streams.py)

  def token_rows(self) -> dict[int, int]:
    """id(request) -> the row of its sampled token in this step's output."""
    rows = {id(req): i for i, (req, _, _) in enumerate(self.plan.chunks)}
    rows.update((id(req), len(self.plan.chunks) + i) for i, req in enumerate(self.plan.decodes))
    return rows


class SlowPending:
  """A step made `factor` times slower (an injected slow instance): ready once factor x the
  step's own duration has passed since it started. On the virtual clock it exposes the
  stretched `end_s` (following the inner step's, which a shared host may move)."""

  def __init__(self, inner, start_s: float, factor: float, clock):
    self.inner, self.start_s, self.factor, self.clock = inner, start_s, factor, clock
    self._due: float | None = None

  @property
  def end_s(self) -> float:
    """Only on the virtual clock (AttributeError otherwise, like a real step's pending)."""
    return self.start_s + self.factor * (self.inner.end_s - self.start_s)

  def ready(self) -> bool:
    if getattr(self.inner, "end_s", None) is not None:
      return self.clock.now() >= self.end_s
    if self._due is None:
      if not self.inner.ready():
        return False
      self._due = self.start_s + self.factor * (self.clock.now() - self.start_s)
    return self.clock.now() >= self._due

  def result(self):
    return self.inner.result()


class InstanceQueue:

  def __init__(self, instance, role: str, max_batch: int):
    self.instance, self.role, self.max_batch = instance, role, max_batch
    self.name: str = instance.name   # (fixed: a re-mesh may reuse the instance under a new one)
    self.waiting: deque[Request] = deque()    # need (re)prefill here, FCFS
    self.running: list[Request] = []          # decoding here
    self.reserved: dict[int, Request] = {}    # id(req) -> promised a decode slot, not running yet
    self.inflight: Step | None = None         # the oldest step in flight
    self.ahead: Step | None = None            # the next one, dispatched before `inflight`'s
                                              # tokens reached the host (overlap)
    self.host_wait_from: float | None = None  # idle with work since (no step in flight)
    self.draining_to: str | None = None       # a pending role switch: takes no new work
    self.dead = False                         # killed (fault injection): no work, no routing
    self.retired = False                      # replaced by a re-mesh (also `dead`)
    self.paused = False                       # a re-mesh holds it: no step is dispatched
    self.prefill_tok_s: float | None = None   # measured, EWMA, per second of prefill step
    self.prefill_drain_tok_s: float | None = None   # per second of wall time with a queue
    self._drain_from: float | None = None     # when the current backlog period's clock started
    self.decode_step_s: float | None = None
    self.transfer_s_per_page: float | None = None   # KV transfers landed here, EWMA
    self.token_interval_s: float | None = None   # between a finished request's tokens after
                                                 # its second, EWMA (`measure_intervals`)
    self.latest_sample: tuple | None = None   # the driver's latest sample of its state (a row)
    self.chain_safe_until: float | None = None   # its chain cannot preempt before (until
                                                 # touched): scheduler/decode_segments.py

  @property
  def tables(self):
    return self.instance.tables

  @property
  def tp(self) -> int:
    return getattr(self.instance, "tp", 1)

  def measure_intervals(self, req: Request) -> None:
    """req finished decoding here: the mean interval between its tokens from its second on
    (what its decode steps took, stalls for the prefill steps between them included; the
    first interval, which may hold a KV transfer, left out)."""
    times = req.token_times
    if len(times) > 2:
      self.token_interval_s = _ewma(self.token_interval_s,
                                    (times[-1] - times[1]) / (len(times) - 2))

  def measure_transfer(self, pages: int, seconds: float) -> None:
    """A transfer of `pages` pages landed here after `seconds` (dispatch to landing seen)."""
    if pages > 0:
      self.transfer_s_per_page = _ewma(self.transfer_s_per_page, seconds / pages)

  def keeps(self, req: Request) -> bool:
    """Whether a request prefilled here also decodes here (no transfer)."""
    return req.path == "colocated" or self.role != "prefill" or req.output_ids != []

  # ---- load signals ----
  def queued_tokens(self) -> int:
    if not self.waiting:   # (a router asks every candidate, at every arrival or transfer)
      return 0
    return sum(r.prefill_len - r.num_computed_tokens for r in self.waiting)

  def num_waiting(self) -> int:
    return len(self.waiting)

  def num_running(self) -> int:
    """Decode slots taken: running sequences plus reservations (transfers in flight here,
    admitted prefills that stay here)."""
    return len(self.running) + len(self.reserved)

  def kv_inbound_pages(self) -> int:
    """KV pages on their way here: the prompts of the requests holding a decode slot that do
    not run yet (transfers in flight or waiting to start)."""
    return sum(self.pages_for(r.prompt_len) for r in self.reserved.values()
               if r.path != "colocated")

  def reserve(self, req: Request) -> None:
    self.reserved[id(req)] = req

  def release(self, req: Request) -> None:
    """Drops req's reservation, if it holds one."""
    self.reserved.pop(id(req), None)

  def join(self, req: Request) -> None:
    """req starts decoding here: its reservation becomes a running slot."""
    self.reserved.pop(id(req), None)
    self.running.append(req)

  def forget(self, req: Request) -> None:
    """Removes req from this worker's queue, running batch and reservations."""
    if req in self.waiting:
      self.waiting.remove(req)
    if req in self.running:
      self.running.remove(req)
    self.reserved.pop(id(req), None)

  def free_pages(self) -> int:
    return self.tables.num_free_pages

  def total_pages(self) -> int:
    return self.tables.allocator.num_pages

  def cached_prefix_pages(self, names: list) -> int:
    """How many of these leading page names this instance's prefix cache holds (0 without a
    cache)."""
    cache = self.tables.cache
    return 0 if cache is None else cache.held(names)

  def prefix_credit(self, names: list, salt: str) -> float:
    """Pages of this leading prefix the instance would not recompute: those its prefix cache
    holds, plus the node's host-tier pages that continue them (landed or being written), each
    worth what a reload saves against a recompute (`instance.host_page_weight`, in [0, 1])."""
    held = self.cached_prefix_pages(names)
    host = getattr(self.tables, "host", None)
    if host is None or held >= len(names):
      return held
    return held + self.instance.host_page_weight * host.held_prefix(names[held:], salt)

  def state_sample(self, now: float) -> tuple:
    """A sample of the state the tier statistics read (RunResult.samples): queue, running
    batch, KV pool (and the node's host tier's pages, when it has one), at `now`: a row of
    scheduler/records.py's SAMPLE_FIELDS."""
    tables = self.tables
    return (now, self.name, self.role, len(self.waiting), len(self.running),
            tables.num_used_pages, tables.allocator.num_pages, tables.num_cached_idle_pages,
            tables.num_unused_slots, None if tables.host is None else len(tables.host))

  def record_state_change(self, samples, now: float) -> None:
    """Adds a sample of this instance's state at `now` to the run's samples unless it equals
    its latest sample in the state the statistics read (records.SAMPLE_STATE): the samples are
    then the state's changes, each holding until the next one (pdjax/metrics/timeline.py
    weights them so; a queue a prefill emptied holds only for that prefill, not for the idle
    gap after it), and an idle instance adds none."""
    sample, latest = self.state_sample(now), self.latest_sample
    if latest is not None and latest[SAMPLE_STATE] == sample[SAMPLE_STATE]:
      return
    samples.add(sample)
    self.latest_sample = sample

  def pages_for(self, num_tokens: int) -> int:
    return self.tables.pages_needed(num_tokens)

  def drained(self) -> bool:
    return (not self.waiting and not self.running and not self.reserved
            and self.inflight is None and self.ahead is None)

  def steps_in_flight(self) -> list[Step]:
    return [s for s in (self.inflight, self.ahead) if s is not None]

  def measure(self, step: Step, end_s: float) -> None:
    seconds = max(end_s - step.start_s, 1e-9)
    if step.kind == "decode":
      self.decode_step_s = _ewma(self.decode_step_s, seconds)
    else:
      self.prefill_tok_s = _ewma(self.prefill_tok_s, step.plan.num_tokens / seconds)
    chunks = step.plan.chunks
    if not chunks:
      return
    # The drain rate counts everything the instance did since its previous prefill step while
    # requests waited (decode and mixed steps, stalls), which per-step throughput leaves out.
    since = step.start_s if self._drain_from is None else self._drain_from
    tokens = sum(end - start for _, start, end in chunks)
    self.prefill_drain_tok_s = _ewma(self.prefill_drain_tok_s,
                                     tokens / max(end_s - since, 1e-9))
    done = sum(1 for req, _, end in chunks if end >= req.prefill_len)
    self._drain_from = end_s if len(self.waiting) > done else None


def _ewma(old: float | None, new: float) -> float:
  return new if old is None else (1 - EWMA) * old + EWMA * new
