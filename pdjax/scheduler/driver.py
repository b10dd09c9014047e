"""The event loop that serves a workload on a set of instances, on the run's clock.

    arrivals ─► static checks (reject what can never fit) ─► path policy ─► router ─► admission
                   │                                                    (accept / reject+reason)
                   ▼
    waiting queue of a worker ─► step policy (prefill_first | chunked_prefill) ─► engine step
                                                             │
              colocated path: the request decodes on the worker that prefilled it
              disaggregated path: transfer queue ─► decode router ─► KV transfer P → D
                                                             │
    running batch of a worker ─► decode rows of the next step ─► EOS / max_new_tokens
    KV pressure ─► preempt the newest running request (free its pages, recompute it later)
    role-switch policy ─► drain a worker, then move it between the prefill and decode tiers

Each worker has at most one step in flight. A loop turn dispatches a step on every idle worker
whose state changed since it last planned (JAX dispatch is asynchronous, so steps on different
sub-meshes run at once), then collects whichever steps are done, polling, so a short decode step
is not held behind a long prefill. Step policies read only their own worker, so an idle worker
that planned nothing stays idle until something touches it (a request queued or transferred in,
its pages freed, its step collected, its role switched): the loop's cost follows events, not
workers, which is what lets the simulator run 64-instance clusters quickly.
Host logic only: instances are passed in; tests drive this loop with fake instances.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque

from pdjax.faults.injector import FaultInjector
from pdjax.faults.spec import FaultSpec
from pdjax.kv.pages import OutOfPages
from pdjax.kv.prefix_cache import flush_tenant, salt_for
from pdjax.request import Request, Status
from pdjax.scheduler import batching
from pdjax.scheduler import policies as policy_lib
from pdjax.scheduler.policies.base import PathChoice, StepPlan
from pdjax.scheduler.errors import DeviceError
from pdjax.scheduler.recovery import Recovery
from pdjax.scheduler.transfers import Transfers
from pdjax.scheduler.worker import SlowPending, Step, Worker

POLL_S = 0.0002   # how often the loop checks in-flight steps when none is done
COLOCATED = PathChoice("colocated", "colocated")


@dataclasses.dataclass(frozen=True)
class DriverOptions:
  token_budget: int          # prompt tokens per prefill step (prefill_first's limit)
  max_prefill_seqs: int      # sequences per prefill step
  max_decode_batch: int      # running sequences per instance
  max_model_len: int         # prompt + generated tokens per sequence
  pool_pages: int            # pages in each instance's pool
  page_size: int
  shared_salt: str = ""      # prefix cache: one salt for all tenants ("" = per tenant)
  tenant_quota_pages: int = 0   # KV pages a tenant may hold or reserve per tier (0: no quota)
  flush_schedule: tuple[tuple[float, str], ...] = ()   # (seconds, tenant): forget its cache
  vocab_size: int = 0        # prompt token ids must be in [0, vocab_size) (0: unchecked)
  transfer_failure_policy: str = "retry_then_recompute"   # or "fail"
  transfer_retries: int = 3  # retries of a failed KV transfer before the policy decides
  transfer_backoff_s: float = 0.005   # first retry's delay; doubles per retry
  transfer_timeout_s: float = 0.0     # an attempt stalled longer fails (0: no timeout)
  lease_s: float = 0.0       # prefill-side KV no decode instance pulled is reclaimed (0: never)
  debug: bool = False        # check every invariant after every loop turn


@dataclasses.dataclass
class RunResult:
  requests: list[Request]
  transfers: list[dict]
  duration_s: float
  steps: list[dict]          # one per executed step (see Driver._collect)
  samples: list[dict]        # worker state at each dispatch
  role_switches: list[dict]
  preemptions: int
  flushes: list[dict] = dataclasses.field(default_factory=list)   # {"t_s", "tenant", "pages"}
  faults: dict = dataclasses.field(default_factory=dict)   # injected and recovery counts

  def step_counts(self) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {}
    for s in self.steps:
      per = counts.setdefault(s["instance"], {})
      per[s["kind"]] = per.get(s["kind"], 0) + 1
    return counts


def default_policies(options: DriverOptions) -> policy_lib.Policies:
  names = dict(prefill_router="least_loaded", decode_router="least_loaded",
               path="always_disagg", admission="none", colocated_policy="prefill_first",
               role_switch="none")
  return policy_lib.build(names, dict(token_budget=options.token_budget,
                                      max_prefill_seqs=options.max_prefill_seqs))


class Driver(Transfers, Recovery):

  def __init__(self, mode: str, workers: list[Worker], *, options: DriverOptions, clock,
               transfer_fn=None, policies: policy_lib.Policies | None = None,
               injector: FaultInjector | None = None):
    if mode not in ("colocated", "disaggregated"):
      raise ValueError(f"mode must be colocated or disaggregated, got {mode!r}")
    self.mode, self.workers, self.opts, self.clock = mode, workers, options, clock
    self.transfer_fn = transfer_fn
    self.policies = policies or default_policies(options)
    roles = {w.role for w in workers}
    needed = {"colocated"} if mode == "colocated" else {"prefill", "decode"}
    if not needed <= roles or (mode == "disaggregated" and not transfer_fn):
      raise ValueError(f"{mode} needs {' and '.join(sorted(needed))} instances"
                       + (" and a transfer function" if mode == "disaggregated" else ""))
    self.transfer_queue: deque[tuple[Request, Worker]] = deque()
    self.transfers: list[dict] = []
    self.steps: list[dict] = []
    self.samples: list[dict] = []
    self.role_switches: list[dict] = []
    self.preemptions = 0
    self.flushes: list[dict] = []
    self.injector = injector or FaultInjector(FaultSpec())
    self._by_name = {w.name: w for w in workers}
    self._terminal = 0
    self._touched = set(range(len(workers)))   # idle workers to plan on the next turn
    self._index = {id(w): i for i, w in enumerate(workers)}
    self._tiers: dict[str, list[Worker]] | None = None
    self._draining: list[Worker] = []
    self._init_recovery()

  def _touch(self, w: Worker) -> None:
    self._touched.add(self._index[id(w)])

  def _finish(self, req: Request, status: Status, now: float, reason: str = "") -> None:
    req.finish(status, now, reason)
    self._terminal += 1      # counted here: summing over all requests every turn is O(n^2)

  def tier(self, role: str) -> list[Worker]:
    """The workers serving `role` now (not draining), in worker order; cached until a role
    switch starts or ends. Policies must not modify the list."""
    if self._tiers is None:
      self._tiers = {}
      for w in self.workers:
        if w.draining_to is None and not w.dead:
          self._tiers.setdefault(w.role, []).append(w)
    return self._tiers.get(role, [])

  # ---- the loop ----------------------------------------------------------------------------

  def run(self, requests: list[Request], on_progress=None) -> RunResult:
    arrivals = deque(sorted(requests, key=lambda r: r.arrival_s))
    self._terminal = sum(r.status.terminal for r in requests)
    done = self._terminal
    while True:
      now = self.clock.now()
      self._run_events(now)
      self._reclaim_leases(now)
      self._admit(arrivals)
      self._apply_cancels()
      self._switch_roles()
      self._start_transfers()
      self._poll_transfers()
      touched, self._touched = sorted(self._touched), set()
      for i in touched:                # worker order, as the policies' tie-breaks expect
        if self.workers[i].inflight is None and not self.workers[i].dead:
          self._dispatch(self.workers[i])
      inflight = [w for w in self.workers if w.inflight is not None]
      wake = self._wake_s()
      for w in self._wait_any(inflight, wake):
        self._collect(w)
      if self.opts.debug:
        self.check_invariants()
      if on_progress and self._terminal != done:
        on_progress(self._terminal - done)
      done = self._terminal
      if inflight or self._pending_transfers:
        continue
      if done >= len(requests) and not arrivals:
        break
      due = [t for t in (arrivals[0].arrival_s if arrivals else None, wake) if t is not None]
      if due:
        self.clock.sleep_until(min(due))
        continue
      if self._cancels:
        self._apply_cancels()
        continue
      self._fail_stalled(requests)   # nothing in flight, nothing to come: cannot progress
    self._run_events(float("inf"), only=("flush",))   # flushes past the last request: at the end
    terminal = sum(r.status.terminal for r in requests)
    if self._terminal != terminal:   # a request finished twice (or behind the driver's back)
      raise AssertionError(f"the driver ended {self._terminal} requests, {terminal} are terminal")
    for w in self.workers:
      if w.running or w.reserved or w.waiting:
        raise AssertionError(f"{w.name} still holds {len(w.waiting)} waiting, {len(w.running)} "
                             f"running, {len(w.reserved)} reserved requests at the end")
    self._check_transfers_not_all_failed()
    return RunResult(requests, self.transfers, self.clock.now(), self.steps, self.samples,
                     self.role_switches, self.preemptions, self.flushes,
                     {"injected": dict(sorted(self.injector.injected.items())),
                      **self.fault_counts})

  def _flush_tenant(self, tenant: str) -> None:
    """A scheduled tenant flush: nothing of the tenant's can be hit after."""
    pages = flush_tenant([w.tables for w in self.workers], tenant, self.opts.shared_salt)
    self.flushes.append({"t_s": self.clock.now(), "tenant": tenant, "pages": pages})
    for w in self.workers:
      self._touch(w)   # freed pages may let a waiting request in

  def _wait_any(self, inflight: list[Worker], wake: float | None = None) -> list[Worker]:
    """The in-flight workers whose step is done, polling until at least one is or until
    `wake` (an event or lease expiry is due)."""
    if not inflight and not self._pending_transfers:
      return []
    ends = [getattr(w.inflight.pending, "end_s", None) for w in inflight]
    lands = [getattr(t, "end_s", None) for *_, t in self._pending_transfers]
    if hasattr(self.clock, "advance_to") and None not in ends + lands:
      # virtual time: jump to the next step's end or transfer's landing, or to the next event
      # if that comes first; landed transfers are finished by the next turn's poll
      due = min(ends + lands)
      self.clock.advance_to(due if wake is None else min(due, wake))
      now = self.clock.now()
      return [w for w, end in zip(inflight, ends) if end <= now]
    while True:
      ready = [w for w in inflight if w.inflight.pending.ready()]
      if ready or (wake is not None and self.clock.now() >= wake) or \
          any(t.ready() for *_, t in self._pending_transfers):
        return ready
      time.sleep(POLL_S)

  def _admit(self, arrivals: deque[Request]) -> None:
    now = self.clock.now()
    o, p = self.opts, self.policies
    while arrivals and arrivals[0].arrival_s <= now:
      req = arrivals.popleft()
      reason = batching.rejection_reason(
          req, max_model_len=o.max_model_len, pool_pages=o.pool_pages, page_size=o.page_size,
          vocab_size=o.vocab_size)
      if not reason:
        choice = (COLOCATED if self.mode == "colocated" else
                  p.path.choose(req, self.tier("prefill"), self.tier("decode")))
        router = p.decode_router if choice.tier == "decode" else p.prefill_router
        worker = router.choose(req, self.tier(choice.tier))
        reason = ("no instance in the " + choice.tier + " tier" if worker is None else
                  p.admission.check(req, worker, choice, self.tier("decode"))
                  or self._quota_reason(req, choice))
      if reason:
        self._finish(req, Status.REJECTED, now, reason)
        continue
      req.path, req.prefill_instance = choice.path, worker.name
      worker.waiting.append(req)
      self._touch(worker)
      self._plan_cancel(req)

  def _salt(self, r: Request) -> str:
    return salt_for(r.tenant, self.opts.shared_salt)

  def _quota_reason(self, req: Request, choice: PathChoice) -> str | None:
    """Per-tenant KV quota on each tier the request will use: the pages its admitted requests
    there may grow to (max_len each) plus this one's must stay within tenant_quota_pages."""
    quota = self.opts.tenant_quota_pages
    if not quota:
      return None
    tiers = [choice.tier] + (["decode"] if choice.path == "disaggregated" else [])
    need = -(-req.max_len // self.opts.page_size)
    for tier in tiers:
      mine = [r for w in self.tier(tier) for r in list(w.waiting) + w.running
              if r.tenant == req.tenant]
      if tier == "decode":
        mine += [r for r, _ in self.transfer_queue if r.tenant == req.tenant]
      held = sum(-(-r.max_len // self.opts.page_size) for r in mine)
      if held + need > quota:
        return (f"tenant {req.tenant!r} over its KV quota on the {tier} tier: {held} + {need} "
                f"pages > {quota}")
    return None

  # ---- steps -------------------------------------------------------------------------------

  def _dispatch(self, w: Worker) -> None:
    plan = self.policies.step.plan(w, admit=lambda r: self._allocate_prefill(w, r))
    if plan.decodes:
      self._ensure_decode_slots(w, plan)
    if plan.empty:
      return
    self._check_step_size(w, plan)
    now = self.clock.now()
    for req, _, _ in plan.chunks:
      if req.prefill_start_s is None:
        req.prefill_start_s = now
      if not req.output_ids:
        req.status = Status.PREFILLING
      self._maybe_cancel(req, "prefill")
    table = w.tables.block_table
    decode_rows = [(r.output_ids[-1], r.prompt_len + len(r.output_ids) - 1, table(r.id),
                    r.sampling.temperature, r.sampling_seed) for r in plan.decodes]
    if plan.chunks:
      kind = "mixed" if plan.decodes else "prefill"
      seqs = [(req.prefill_tokens[start:end], start, table(req.id), req.sampling.temperature,
               req.sampling_seed) for req, start, end in plan.chunks]
      seqs += [([tok], pos, pages, t, seed) for tok, pos, pages, t, seed in decode_rows]
      call = lambda: w.instance.prefill(seqs)
    else:
      kind, call = "decode", lambda: w.instance.decode(decode_rows)
    self.samples.append({"t": now, "instance": w.name, "role": w.role,
                         "queued": w.num_waiting(), "running": len(w.running),
                         "kv_pages_used": w.tables.num_used_pages,
                         "kv_pages_total": w.total_pages(),
                         "kv_pages_cached": w.tables.num_cached_idle_pages,
                         "kv_slots_unused": w.tables.num_unused_slots})
    try:
      pending, slow = call(), self.injector.slow_factor(w.name, now)
      if slow > 1:
        self.injector.injected["slow_step"] += 1
        pending = SlowPending(pending, now, slow, self.clock)
      w.inflight = Step(plan, pending, now, kind)
    except DeviceError as e:  # a device failure fails the step's requests, never the run
      self._fail_plan(w, plan, f"{kind} step failed on {w.name}: {type(e).__name__}: {e}")

  def _check_step_size(self, w: Worker, plan: StepPlan) -> None:
    """No instance ever plans a step larger than its largest compiled bucket: such a step
    could only fail, taking its whole batch with it (a scheduling bug, so it raises)."""
    o = self.opts
    if plan.chunks:
      rows = len(plan.chunks) + len(plan.decodes)
      if plan.num_tokens > o.token_budget or rows > o.max_prefill_seqs:
        raise AssertionError(f"{w.name} planned a prefill step of {plan.num_tokens} tokens in "
                             f"{rows} sequences; its largest bucket is {o.token_budget} tokens "
                             f"in {o.max_prefill_seqs}")
    elif len(plan.decodes) > w.max_batch:
      raise AssertionError(f"{w.name} planned a decode step of {len(plan.decodes)} rows; its "
                           f"largest bucket is {w.max_batch}")

  def _allocate_prefill(self, w: Worker, r: Request) -> bool:
    """Gives a waiting request its pages; with a prefix cache, its longest cached prefix is
    reused and counts as computed (the prefill starts after it)."""
    if r.id in w.tables:
      return True
    cached = w.tables.allocate_prefix(r.id, r.prefill_tokens, r.prefill_len, self._salt(r),
                                      self.clock.now(), owner=r.tenant)
    if cached is None:
      return False
    if w.keeps(r):
      w.reserve(r)                     # its decode slot here is promised from now on
    r.num_computed_tokens = cached
    if not r.output_ids:               # prompt tokens served from the cache (first prefill)
      r.cached_tokens = cached
    return True

  def _ensure_decode_slots(self, w: Worker, plan: StepPlan) -> None:
    """Grows each decoding sequence's block table by the slot its next token needs; when the
    pool is full, preempts the newest running sequence (recompute later) until it fits."""
    preempted: set[int] = set()
    for r in list(plan.decodes):
      if id(r) in preempted:
        continue
      while True:
        try:
          w.tables.extend(r.id, r.prompt_len + len(r.output_ids))
          break
        except OutOfPages:
          victim = next((v for v in reversed(w.running) if v is not r), r)
          self._preempt(w, victim, plan)
          preempted.add(id(victim))
          if victim is r:
            break

  def _preempt(self, w: Worker, victim: Request, plan: StepPlan) -> None:
    w.tables.free(victim.id, self.clock.now())
    w.running.remove(victim)
    if victim in plan.decodes:
      plan.decodes.remove(victim)
    victim.num_computed_tokens = 0
    victim.preemptions += 1
    victim.status = Status.WAITING
    w.waiting.appendleft(victim)
    self.preemptions += 1

  def _collect(self, w: Worker) -> None:
    step, w.inflight = w.inflight, None
    self._touch(w)
    plan = step.plan
    try:
      tokens = step.pending.result()
    except DeviceError as e:
      self._fail_plan(w, plan, f"{step.kind} step failed on {w.name}: {type(e).__name__}: {e}")
      return
    now = self.clock.now()
    w.measure(step, now)
    self.steps.append({"instance": w.name, "role": w.role, "kind": step.kind,
                       "start_s": step.start_s, "end_s": now,
                       "num_seqs": len(plan.chunks) + len(plan.decodes),
                       "num_tokens": plan.num_tokens})
    for (req, _, end), token in zip(plan.chunks, tokens):
      if id(req) in self._cancels:
        continue                       # cancelled while in flight: dropped next turn
      req.num_computed_tokens = end
      w.tables.cache_computed(req.id, end, now)
      if end < req.prefill_len:
        continue                       # a partial chunk: its sampled token means nothing
      w.waiting.remove(req)
      if self._non_finite(w, req, token, now):
        continue
      if req.output_ids:               # a recomputed sequence (preempted, or moved) resumes
        req.status, req.decode_instance = Status.DECODING, w.name
        if req.decode_start_s is None:
          req.decode_start_s = now
        w.join(req)
        continue
      stays = w.keeps(req)
      req.prefill_end_s = now
      if self._emit(w, req, token, now):
        continue
      if stays:
        req.status, req.decode_instance, req.decode_start_s = Status.DECODING, w.name, now
        w.join(req)
      else:
        req.status = Status.TRANSFERRING
        self.transfer_queue.append((req, w))
        self._held_since[id(req)] = now
        self._maybe_cancel(req, "transfer_wait")
    for req, token in zip(plan.decodes, tokens[len(plan.chunks):]):
      if id(req) in self._cancels:
        continue
      if not self._non_finite(w, req, token, now) and not self._emit(w, req, token, now):
        self._maybe_cancel(req, "decode", len(req.output_ids))

  def _non_finite(self, w: Worker, req: Request, token: int, now: float) -> bool:
    """A negative token is the engine's mark for non-finite logits: the request fails."""
    if token >= 0:
      return False
    w.forget(req)
    w.tables.free(req.id, now)
    self._finish(req, Status.FAILED, now,
                 "the model produced non-finite logits (NaN/inf); no token was sampled")
    return True

  def _emit(self, w: Worker, req: Request, token: int, now: float) -> bool:
    """Appends a generated token; finishes the request (freeing its pages) when it is done."""
    if not req.add_token(token, now):
      return False
    w.forget(req)
    if w.tables.cache is not None:
      # The KV now holds the prompt and every generated token but the last: name its full
      # pages so a follow-up turn that repeats this conversation can hit them.
      w.tables.cache_computed(req.id, req.prompt_len + len(req.output_ids) - 1, now,
                              token_ids=list(req.prompt_ids) + req.output_ids[:-1])
    w.tables.free(req.id, now)
    self._finish(req, Status.FINISHED, now)
    return True

  # ---- role switching (disaggregated) ------------------------------------------------------

  def _switch_roles(self) -> None:
    if self.mode != "disaggregated":
      return
    now = self.clock.now()
    for w, role in self.policies.role_switch.decide(now, self.tier("prefill"),
                                                    self.tier("decode"),
                                                    len(self.transfer_queue)):
      if w.draining_to is None and role != w.role:
        w.draining_to, self._tiers = role, None
        self._draining.append(w)
        self._touch(w)
    for w in list(self._draining):
      if w.drained() and not len(w.tables):
        self.role_switches.append({"t": now, "instance": w.name, "from": w.role,
                                   "to": w.draining_to})
        w.role, w.draining_to, self._tiers = w.draining_to, None, None
        self._draining.remove(w)
        self._touch(w)

  # ---- failure paths -----------------------------------------------------------------------

  def _fail_plan(self, w: Worker, plan: StepPlan, reason: str) -> None:
    now = self.clock.now()
    self._touch(w)
    for r in [req for req, _, _ in plan.chunks] + plan.decodes:
      w.forget(r)
      if r.id in w.tables:
        w.tables.free(r.id, now)
      self._finish(r, Status.FAILED, now, reason)

  def _fail_stalled(self, requests: list[Request]) -> None:
    now = self.clock.now()
    for w in self.workers:
      for r in list(w.waiting) + w.running:
        if r.id in w.tables:
          w.tables.free(r.id, now)
      w.waiting.clear()
      w.running.clear()
      w.reserved.clear()
    for r, src in self.transfer_queue:
      src.tables.free(r.id, now)
    self.transfer_queue.clear()
    self._held_since.clear()
    for r in requests:
      if not r.status.terminal:
        self._finish(r, Status.FAILED, now, "scheduler stalled: no step in flight and none possible")

  def check_invariants(self) -> None:
    """Raises AssertionError on the first broken invariant: every queued request is live and
    in exactly one place (a queue, a transfer, a retry), and each pool's bookkeeping holds
    (see BlockTables.check_invariants). Costs O(queued requests + pages), not O(run)."""
    places: dict[int, list] = {}
    in_transfer = [(r, s) for r, s, _ in self._in_transfer.values()]
    queued = [r for w in self.workers for r in list(w.waiting) + w.running]
    queued += [r for r, _ in list(self.transfer_queue) + list(self._retrying.values())
               + in_transfer]
    for r in queued:
      places.setdefault(id(r), [r, 0])[1] += 1
    for r, n in places.values():
      if r.status.terminal:
        raise AssertionError(f"request {r.id} is {r.status.value} but still queued ({n} places)")
      if n > 1:
        raise AssertionError(f"request {r.id} is in {n} places at once")
    for w in self.workers:
      w.tables.check_invariants()
      self._check_slots(w)

  def _check_slots(self, w: Worker) -> None:
    """Decode slots: running + reserved within the largest decode bucket, and every
    reservation held by a live request admitted here or a transfer in flight here."""
    if len(w.running) + len(w.reserved) > w.max_batch:
      raise AssertionError(f"{w.name}: {len(w.running)} running + {len(w.reserved)} reserved "
                           f"decode slots exceed its largest bucket {w.max_batch}")
    for r in w.reserved.values():
      moving = self._in_transfer.get(id(r))
      if r.status.terminal or not ((r in w.waiting and r.id in w.tables)
                                   or (moving is not None and moving[2] is w)):
        raise AssertionError(f"{w.name}: request {r.id} ({r.status.value}) holds a decode slot "
                             f"reservation it has no claim to")
