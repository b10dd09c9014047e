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

from collections import deque

from pdjax.faults.injector import FaultInjector
from pdjax.faults.spec import FaultSpec
from pdjax.kv.audit import KvAudit
from pdjax.kv.prefix_cache import flush_tenant
from pdjax.request import Request, Status
from pdjax.scheduler import policies as policy_lib
from pdjax.scheduler.admission import Admission
from pdjax.scheduler.collect import Collect
from pdjax.scheduler.decode_segments import DecodeSegments
from pdjax.scheduler.driver_options import DriverOptions  # noqa: F401  (re-exported)
from pdjax.scheduler.fast_forward import FastForward
from pdjax.scheduler.instance_queue import InstanceQueue
from pdjax.scheduler.invariants import Invariants
from pdjax.scheduler.policies.base import StepPlan
from pdjax.scheduler.policy_api import Slo, Views
from pdjax.scheduler.policy_guard import guard
from pdjax.scheduler.records import SAMPLE_FIELDS, STEP_FIELDS, new_records
from pdjax.scheduler.recovery import Recovery
from pdjax.scheduler.remesh import Remesh
from pdjax.scheduler.run_result import RunResult  # noqa: F401  (re-exported)
from pdjax.scheduler.spill import SpilledList
from pdjax.scheduler.steps import Steps
from pdjax.scheduler.streams import Streams
from pdjax.scheduler.tally import Tally
from pdjax.scheduler.transfers import Transfers
from pdjax.scheduler.waiting import Waiting

IDLE_WAIT_S = 0.05   # an idle driver serving an inbox checks back this often


def _slo(options: DriverOptions) -> Slo | None:
  if options.slo_ttft_s > 0 and options.slo_tpot_s > 0:
    return Slo(options.slo_ttft_s, options.slo_tpot_s)
  return None


def default_policies(options: DriverOptions) -> policy_lib.Policies:
  names = dict(prefill_router="least_loaded", decode_router="least_loaded",
               path="always_disagg", admission="none", colocated_policy="prefill_first",
               role_switch="none")
  return policy_lib.build(names, dict(token_budget=options.token_budget,
                                      max_prefill_seqs=options.max_prefill_seqs))


class Driver(Admission, Steps, Streams, Collect, FastForward, DecodeSegments, Transfers,
             Recovery, Remesh, Invariants, Waiting):

  def __init__(self, mode: str, workers: list[InstanceQueue], *, options: DriverOptions, clock,
               transfer_fn=None, policies: policy_lib.Policies | None = None,
               injector: FaultInjector | None = None, spill_dir: str | None = None,
               remesh_builder=None, remesh_drain: str = "migrate"):
    """remesh_builder: builds and releases instances for `scheduler.role_switch=remesh`
    (scheduler/remesh.py; None: no re-meshing); remesh_drain: migrate | finish.
    spill_dir: a folder where a long-lived run (a server) keeps its records: the steps,
    state samples and transfers (scheduler/spill.py) and the terminal requests, which leave
    memory as they end (RunResult.requests then holds them in the order they ended). Default:
    plain lists, requests in the order they were given."""
    if mode not in ("colocated", "disaggregated"):
      raise ValueError(f"mode must be colocated or disaggregated, got {mode!r}")
    self.mode, self.workers, self.opts, self.clock = mode, workers, options, clock
    self.transfer_fn = transfer_fn
    self._views = Views(_slo(options))
    self.policies = guard(policies or default_policies(options), self._views)
    roles = {w.role for w in workers}
    needed = {"colocated"} if mode == "colocated" else {"prefill", "decode"}
    if not needed <= roles or (mode == "disaggregated" and not transfer_fn):
      raise ValueError(f"{mode} needs {' and '.join(sorted(needed))} instances"
                       + (" and a transfer function" if mode == "disaggregated" else ""))
    self.transfer_queue: deque[tuple[Request, InstanceQueue]] = deque()
    self.spill_dir = spill_dir
    self.transfers: list[dict] = self._records("transfers")
    self.steps = new_records(STEP_FIELDS, self._spill_path("steps"))        # RecordTable or
    self.samples = new_records(SAMPLE_FIELDS, self._spill_path("samples"))  # SpilledRecords
    self.role_switches: list[dict] = []
    self.preemptions = 0
    self.segment_steps = 0   # steps collected in decode segments (scheduler/decode_segments.py)
    self.flushes = self._records("flushes")   # (spilled in a long-lived server, as the steps)
    self.kv_audit = (KvAudit(self.clock.now, self._records("kv_audit"))
                     if any(w.instance.tables.cache is not None for w in workers) else None)
    for w in workers:
      self._audit(w)
    self.injector = injector or FaultInjector(FaultSpec())
    self._by_name = {w.name: w for w in workers}
    self._terminal = 0
    self._touched = set(range(len(workers)))   # idle workers to plan on the next turn
    self._index = {id(w): i for i, w in enumerate(workers)}
    for w in workers:
      w.latest_sample = None   # (workers may serve an earlier driver's run)
    self._tiers: dict[str, list[InstanceQueue]] | None = None
    self._draining: list[InstanceQueue] = []
    self._init_recovery()
    self._init_remesh(remesh_builder, remesh_drain)
    self._inbox = self._listener = None
    self._path_reasons: dict[str, dict] = {}   # the shared path_reason of a policy that gives none
    self.requests: list[Request] = []   # the run's requests (Driver.run; see spill_dir)
    self._open: dict[int, Request] = {}   # id -> taken, not terminal yet
    self._taken = 0
    self.tally = Tally()

  def _audit(self, w: InstanceQueue) -> None:
    """w's pool (and the host tier it shares) record their KV events in the run's audit."""
    tables = w.instance.tables
    if self.kv_audit is None or tables.cache is None:
      return
    kv_bytes = getattr(w.instance, "kv_bytes", None)
    page_bytes = kv_bytes(1) if kv_bytes is not None else 0
    tables.attach_audit(self.kv_audit, w.name, page_bytes)
    if tables.host is not None:
      tables.host.attach_audit(self.kv_audit, page_bytes)

  def _records(self, name: str) -> list:
    return [] if self.spill_dir is None else SpilledList(f"{self.spill_dir}/{name}.pkl")

  def _spill_path(self, name: str) -> str | None:
    return None if self.spill_dir is None else f"{self.spill_dir}/{name}.pkl"

  def _take(self, req: Request) -> None:
    """A request joins the run."""
    self._taken += 1
    if not req.status.terminal:
      self._open[id(req)] = req
    if self.spill_dir is None or req.status.terminal:
      self.requests.append(req)

  def _touch(self, w: InstanceQueue) -> None:
    self._touched.add(self._index[id(w)])

  def _record_state(self, w: InstanceQueue, sampled: int) -> None:
    """Samples w's state after its dispatches of this turn, if it changed
    (InstanceQueue.record_state_change). Every change of the state the statistics read (a request
    queued or transferred in, a step collected, pages freed, a role switched) touches w, and a
    touched worker comes here, so the samples follow that state over time, as the statistics'
    hold-time weights assume.
    sampled: len(self.samples) before the dispatches; a dispatch samples the state it launches
    a step from (Steps._dispatch), which holds unless the dispatch failed (touching w)."""
    if len(self.samples) > sampled:
      w.latest_sample = self.samples.last_row()
      if self._index[id(w)] not in self._touched:
        return
    w.record_state_change(self.samples, self.clock.now())

  def _finish(self, req: Request, status: Status, now: float, reason: str = "") -> None:
    req.finish(status, now, reason)
    self._attempts.pop(id(req), None)   # (keyed by id(req): a later request may reuse the id)
    self._retrying.pop(id(req), None)
    self._views.forget(req)             # (its policy view: a server runs for days)
    self._terminal += 1      # counted here: summing over all requests every turn is O(n^2)
    del self._open[id(req)]
    if self.spill_dir is not None:
      self.requests.append(req)   # and nothing else holds it once its listener is done
    if self._listener is not None:
      self._listener.on_finish(req)

  def tier(self, role: str) -> list[InstanceQueue]:
    """The workers serving `role` now (not draining), in worker order; cached until a role
    switch starts or ends. Policies must not modify the list."""
    if self._tiers is None:
      self._tiers = {}
      for w in self.workers:
        if w.draining_to is None and not w.dead:
          self._tiers.setdefault(w.role, []).append(w)
    return self._tiers.get(role, [])

  # ---- the loop ----------------------------------------------------------------------------

  def run(self, requests: list[Request], on_progress=None, inbox=None,
          listener=None) -> RunResult:
    """Serves `requests` (and, with an `inbox` (scheduler/inbox.py), whatever other threads
    hand it until the inbox is closed) to their terminal states. listener: an object with
    `on_token(req) -> bool` (called after each generated token; True ends the request there,
    finished: a server's stop string) and `on_finish(req)` (called once a request is terminal)."""
    self.requests = self._records("requests")
    for r in requests:
      self._take(r)
    arrivals = deque(sorted(self._open.values(), key=lambda r: r.arrival_s))
    self._terminal = self._taken - len(self._open)
    self._inbox, self._listener = inbox, listener
    fast_forward, fast_forwarded = self._fast_forward_possible(), 0
    segments = fast_forward and self._segments_possible()
    self._begin_segments()
    done = self._terminal
    while True:
      now = self.clock.now()
      if inbox is not None:
        self._take_inbox(inbox, arrivals)
      self._run_events(now)
      self._reclaim_leases(now)
      self._admit(arrivals)
      self._apply_cancels()
      self._switch_roles()
      self._remesh_turn()
      self._start_transfers()
      self._poll_transfers()
      self._poll_restarts()
      touched, self._touched = sorted(self._touched), set()
      for i in touched:                # worker order, as the policies' tie-breaks expect
        w = self.workers[i]
        w.chain_safe_until = None      # (its batch or pool may have changed)
        if w.dead or w.paused:
          continue
        sampled = len(self.samples)
        if w.inflight is None:
          self._dispatch(w)
        if self._can_dispatch_ahead(w):
          self._dispatch(w, ahead=True)
        self._record_state(w, sampled)
      turn_now = False
      if fast_forward:
        collected, turn_now = self._fast_forward(arrivals, segments)
        fast_forwarded += collected
      inflight = [w for w in self.workers if w.inflight is not None]
      wake = self._wake_with_arrivals(arrivals)
      for w in () if turn_now else self._wait_any(inflight, wake):
        self._collect(w)
      self.steps.flush_if_full()     # (records buffered as rows: into their columns)
      self.samples.flush_if_full()
      if self.opts.debug:
        self.check_invariants()
      if on_progress and self._terminal != done:
        on_progress(self._terminal - done)
      done = self._terminal
      if (inflight or turn_now or self._pending_transfers or self._restarting or self._touched
          or self._remesh_ready()):
        continue
      if done >= self._taken and not arrivals:
        if inbox is None or inbox.closed:
          break
      held = self._holds_arrivals()   # (arrivals a re-mesh holds are due at its rejoin)
      due = [t for t in (arrivals[0].arrival_s if arrivals and not held else None, wake)
             if t is not None]
      if inbox is not None and (due or done >= self._taken):
        inbox.wait(min(due) - self.clock.now() if due else IDLE_WAIT_S)   # or a submission
        continue
      if due:
        self.clock.sleep_until(min(due))
        continue
      if self._cancels:
        self._apply_cancels()
        continue
      self._fail_stalled()   # nothing in flight, nothing to come: cannot progress
    self._run_events(float("inf"), only=("flush",))   # flushes past the last request: at the end
    self._finish_remesh_at_end()
    terminal = sum(r.status.terminal for r in self.requests) if self.spill_dir is None else \
        len(self.requests)
    if self._terminal != terminal or self._open:   # a request ended twice or behind its back
      raise AssertionError(f"the driver ended {self._terminal} requests, {terminal} are terminal")
    for w in self.workers:
      if w.running or w.reserved or w.waiting:
        raise AssertionError(f"{w.name} still holds {len(w.waiting)} waiting, {len(w.running)} "
                             f"running, {len(w.reserved)} reserved requests at the end")
    self._check_transfers_not_all_failed()
    self._check_request_state_released()
    if segments:
      self._settle_segments()
    if self.kv_audit is not None:
      self.kv_audit.close()
    return RunResult(self.requests, self.transfers, self.clock.now(), self.steps, self.samples,
                     self.role_switches, self.preemptions, self.flushes,
                     {"injected": dict(sorted(self.injector.injected.items())),
                      **self.fault_counts,
                      **({"transfer_errors": dict(sorted(self.transfer_errors.items()))}
                         if self.transfer_errors else {})}, fast_forwarded, self.tally, self.segment_steps,
                     self.remesh_events, self.instances_used,
                     self.kv_audit.sink if self.kv_audit is not None else [])

  def _wake_with_arrivals(self, arrivals: deque) -> float | None:
    """When the wait for steps in flight must end: an event or lease expiry (_wake_s), or the
    next arrival (admitted then, and started at once on an idle instance, not when another
    instance's step ends). Every due arrival was admitted this turn unless a re-mesh holds
    them (then they wait for its rejoin, an event of its own)."""
    wake = self._wake_s()
    if not arrivals or self._holds_arrivals():
      return wake
    return arrivals[0].arrival_s if wake is None else min(wake, arrivals[0].arrival_s)

  def _take_inbox(self, inbox, arrivals: deque) -> None:
    """New requests join the arrivals (stamped by their submitter), cancellations apply, calls
    run here, on the driver's thread."""
    for kind, payload in inbox.take():
      if kind == "request":
        self._take(payload)
        arrivals.append(payload)
      elif kind == "cancel":
        self.cancel(payload, "client")
      else:
        fn, future = payload
        try:
          future.set_result(fn(self))
        except Exception as e:  # pylint: disable=broad-except  (the caller re-raises it)
          future.set_exception(e)

  def flush_tenant(self, tenant: str) -> int:
    """A tenant flush (kv.flush_tenants, or a server's POST /v1/kv/flush): nothing of the
    tenant's can be hit after, on any instance or node. Returns the pages forgotten."""
    pages = flush_tenant([w.tables for w in self.workers], tenant, self.opts.shared_salt)
    self.flushes.append({"t_s": self.clock.now(), "tenant": tenant, "pages": pages})
    for w in self.workers:
      self._touch(w)   # freed pages may let a waiting request in
    return pages

  # Admission (pdjax/scheduler/admission.py), step dispatch (steps.py), step collection
  # (collect.py), KV transfers (transfers.py), recovery (recovery.py) and the invariant checks
  # (invariants.py) are mixins of this class, one concept per file.

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

  def _fail_plan(self, w: InstanceQueue, plan: StepPlan, reason: str) -> None:
    now = self.clock.now()
    self._touch(w)
    for r in [req for req, _, _ in plan.chunks] + plan.decodes:
      if r.status.terminal:            # stopped at the step before (overlap) or failed with it
        continue
      w.forget(r)
      if r.id in w.tables:
        w.tables.free(r.id, now)
      self._finish(r, Status.FAILED, now, reason)

  def _fail_stalled(self) -> None:
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
    for r in list(self._open.values()):
      self._finish(r, Status.FAILED, now, "scheduler stalled: no step in flight and none possible")
