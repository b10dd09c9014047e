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

from pdjax.kv.pages import OutOfPages
from pdjax.kv.prefix_cache import salt_for
from pdjax.request import Request, Status
from pdjax.scheduler import batching
from pdjax.scheduler import policies as policy_lib
from pdjax.scheduler.policies.base import PathChoice, StepPlan
from pdjax.scheduler.worker import Step, Worker

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


class Driver:

  def __init__(self, mode: str, workers: list[Worker], *, options: DriverOptions, clock,
               transfer_fn=None, policies: policy_lib.Policies | None = None):
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
    self._flush_queue = deque(sorted(options.flush_schedule))
    self._terminal = 0
    self._touched = set(range(len(workers)))   # idle workers to plan on the next turn
    self._index = {id(w): i for i, w in enumerate(workers)}
    self._tiers: dict[str, list[Worker]] | None = None
    self._draining: list[Worker] = []

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
        if w.draining_to is None:
          self._tiers.setdefault(w.role, []).append(w)
    return self._tiers.get(role, [])

  # ---- the loop ----------------------------------------------------------------------------

  def run(self, requests: list[Request], on_progress=None) -> RunResult:
    arrivals = deque(sorted(requests, key=lambda r: r.arrival_s))
    self._terminal = sum(r.status.terminal for r in requests)
    done = self._terminal
    while True:
      self._flush_tenants(self.clock.now())
      self._admit(arrivals)
      self._switch_roles()
      self._start_transfers()
      touched, self._touched = sorted(self._touched), set()
      for i in touched:                # worker order, as the policies' tie-breaks expect
        if self.workers[i].inflight is None:
          self._dispatch(self.workers[i])
      inflight = [w for w in self.workers if w.inflight is not None]
      for w in self._wait_any(inflight):
        self._collect(w)
      if on_progress and self._terminal != done:
        on_progress(self._terminal - done)
      done = self._terminal
      if inflight:
        continue
      if arrivals:
        due = arrivals[0].arrival_s
        if self._flush_queue:
          due = min(due, self._flush_queue[0][0])
        self.clock.sleep_until(due)
        continue
      if done == len(requests):
        break
      self._fail_stalled(requests)   # nothing in flight, nothing to come: cannot progress
    self._flush_tenants(float("inf"))   # flushes scheduled past the last request: at the end
    return RunResult(requests, self.transfers, self.clock.now(), self.steps, self.samples,
                     self.role_switches, self.preemptions, self.flushes)

  def _flush_tenants(self, now: float) -> None:
    """Runs the scheduled tenant flushes that are due: nothing of theirs can be hit after."""
    while self._flush_queue and self._flush_queue[0][0] <= now:
      _, tenant = self._flush_queue.popleft()
      salt = salt_for(tenant, self.opts.shared_salt)
      pages = sum(w.tables.cache.flush(salt) for w in self.workers if w.tables.cache is not None)
      self.flushes.append({"t_s": self.clock.now(), "tenant": tenant, "pages": pages})
      for w in self.workers:
        self._touch(w)   # freed pages may let a waiting request in

  def _wait_any(self, inflight: list[Worker]) -> list[Worker]:
    """The in-flight workers whose step is done, polling until at least one is."""
    if not inflight:
      return []
    ends = [getattr(w.inflight.pending, "end_s", None) for w in inflight]
    if hasattr(self.clock, "advance_to") and None not in ends:
      self.clock.advance_to(min(ends))   # virtual time: jump to the next step's end
      now = self.clock.now()
      return [w for w, end in zip(inflight, ends) if end <= now]
    while True:
      ready = [w for w in inflight if w.inflight.pending.ready()]
      if ready:
        return ready
      time.sleep(POLL_S)

  def _admit(self, arrivals: deque[Request]) -> None:
    now = self.clock.now()
    o, p = self.opts, self.policies
    while arrivals and arrivals[0].arrival_s <= now:
      req = arrivals.popleft()
      reason = batching.rejection_reason(
          req, max_model_len=o.max_model_len, pool_pages=o.pool_pages, page_size=o.page_size,
          token_budget=getattr(p.step, "max_prompt_tokens", o.token_budget))
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
    now = self.clock.now()
    for req, _, _ in plan.chunks:
      if req.prefill_start_s is None:
        req.prefill_start_s = now
      if not req.output_ids:
        req.status = Status.PREFILLING
    table = w.tables.block_table
    decode_rows = [(r.output_ids[-1], r.prompt_len + len(r.output_ids) - 1, table(r.id),
                    r.sampling.temperature) for r in plan.decodes]
    if plan.chunks:
      kind = "mixed" if plan.decodes else "prefill"
      seqs = [(req.prefill_tokens[start:end], start, table(req.id), req.sampling.temperature)
              for req, start, end in plan.chunks]
      seqs += [([tok], pos, pages, t) for tok, pos, pages, t in decode_rows]
      call = lambda: w.instance.prefill(seqs)
    else:
      kind, call = "decode", lambda: w.instance.decode(decode_rows)
    self.samples.append({"t": now, "instance": w.name, "role": w.role,
                         "queued": w.num_waiting(), "running": w.num_running(),
                         "kv_pages_used": w.tables.num_used_pages,
                         "kv_pages_total": w.total_pages(),
                         "kv_pages_cached": w.tables.num_cached_idle_pages,
                         "kv_slots_unused": w.tables.num_unused_slots})
    try:
      w.inflight = Step(plan, call(), now, kind)
    except Exception as e:  # a failed step fails its requests, never the run
      self._fail_plan(w, plan, f"{kind} step failed on {w.name}: {type(e).__name__}: {e}")

  def _allocate_prefill(self, w: Worker, r: Request) -> bool:
    """Gives a waiting request its pages; with a prefix cache, its longest cached prefix is
    reused and counts as computed (the prefill starts after it)."""
    if r.id in w.tables:
      return True
    cached = w.tables.allocate_prefix(r.id, r.prefill_tokens, r.prefill_len, self._salt(r),
                                      self.clock.now(), owner=r.tenant)
    if cached is None:
      return False
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
    except Exception as e:
      self._fail_plan(w, plan, f"{step.kind} step failed on {w.name}: {type(e).__name__}: {e}")
      return
    now = self.clock.now()
    w.measure(step, now)
    self.steps.append({"instance": w.name, "role": w.role, "kind": step.kind,
                       "start_s": step.start_s, "end_s": now,
                       "num_seqs": len(plan.chunks) + len(plan.decodes),
                       "num_tokens": plan.num_tokens})
    for (req, _, end), token in zip(plan.chunks, tokens):
      req.num_computed_tokens = end
      w.tables.cache_computed(req.id, end, now)
      if end < req.prefill_len:
        continue                       # a partial chunk: its sampled token means nothing
      w.waiting.remove(req)
      if req.output_ids:               # a recomputed (preempted) sequence resumes decoding
        req.status = Status.DECODING
        w.running.append(req)
        continue
      stays = w.keeps(req)
      req.prefill_end_s = now
      if self._emit(w, req, token, now):
        continue
      if stays:
        req.status, req.decode_instance, req.decode_start_s = Status.DECODING, w.name, now
        w.running.append(req)
      else:
        req.status = Status.TRANSFERRING
        self.transfer_queue.append((req, w))
    for req, token in zip(plan.decodes, tokens[len(plan.chunks):]):
      self._emit(w, req, token, now)

  def _emit(self, w: Worker, req: Request, token: int, now: float) -> bool:
    """Appends a generated token; finishes the request (freeing its pages) when it is done."""
    if not req.add_token(token, now):
      return False
    if req in w.running:
      w.running.remove(req)
    if w.tables.cache is not None:
      # The KV now holds the prompt and every generated token but the last: name its full
      # pages so a follow-up turn that repeats this conversation can hit them.
      w.tables.cache_computed(req.id, req.prompt_len + len(req.output_ids) - 1, now,
                              token_ids=list(req.prompt_ids) + req.output_ids[:-1])
    w.tables.free(req.id, self.clock.now())
    self._finish(req, Status.FINISHED, now)
    return True

  # ---- KV transfer and role switching (disaggregated) --------------------------------------

  def _start_transfers(self) -> None:
    while self.transfer_queue:
      r, src = self.transfer_queue[0]
      need = r.prompt_len + 1          # the prompt's KV plus the first decode step's slot
      eligible = [d for d in self.tier("decode")
                  if d.num_running() < d.max_batch and d.tables.can_allocate(need)]
      dst = self.policies.decode_router.choose(r, eligible)
      if dst is None:
        return   # decode tier full: the request waits (holding its prefill pages)
      self.transfer_queue.popleft()
      src_pages = src.tables.block_table(r.id)
      # With a prefix cache on the decode instance (multi-turn sessions), the pages it already
      # holds are reused and only the rest move.
      hit = dst.tables.allocate_prefix(r.id, r.prefill_tokens, need, self._salt(r),
                                       self.clock.now(), owner=r.tenant)
      skip = hit // self.opts.page_size
      r.decode_cached_tokens = hit
      dst_pages = dst.tables.block_table(r.id)
      r.transfer_start_s = self.clock.now()
      try:
        result = self.transfer_fn(src.instance, src_pages[skip:], dst.instance,
                                  dst_pages[skip:len(src_pages)])
      except Exception as e:
        now = self.clock.now()
        self.transfers.append({"bytes": 0, "seconds": now - r.transfer_start_s, "ok": False})
        src.tables.free(r.id, self.clock.now())
        dst.tables.free(r.id, self.clock.now())
        self._touch(src)
        self._finish(r, Status.FAILED, now,
                 f"kv transfer {src.name}->{dst.name} failed: {type(e).__name__}: {e}")
        continue
      src.tables.free(r.id, self.clock.now())
      dst.tables.cache_computed(r.id, r.prompt_len, self.clock.now())
      self._touch(src)
      self._touch(dst)
      r.transfer_end_s = self.clock.now()
      r.transfer_bytes, r.transfer_s = result.bytes, result.seconds
      self.transfers.append({"bytes": result.bytes, "seconds": result.seconds, "ok": True})
      r.status, r.decode_instance, r.decode_start_s = Status.DECODING, dst.name, r.transfer_end_s
      dst.running.append(r)

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
      for queue in (w.waiting, w.running):
        if r in queue:
          queue.remove(r)
      if r.id in w.tables:
        w.tables.free(r.id, self.clock.now())
      self._finish(r, Status.FAILED, now, reason)

  def _fail_stalled(self, requests: list[Request]) -> None:
    now = self.clock.now()
    for w in self.workers:
      for r in list(w.waiting) + w.running:
        if r.id in w.tables:
          w.tables.free(r.id, self.clock.now())
      w.waiting.clear()
      w.running.clear()
    for r, src in self.transfer_queue:
      src.tables.free(r.id, self.clock.now())
    self.transfer_queue.clear()
    for r in requests:
      if not r.status.terminal:
        self._finish(r, Status.FAILED, now, "scheduler stalled: no step in flight and none possible")
