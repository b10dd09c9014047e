"""Decode fast-forward on the virtual clock (the simulator): between events, decode chains run
without loop turns.

A worker whose step in flight is a plain decode step and that has nothing queued, reserved or
draining steps on its own until something reaches it: its next step is dispatched when this
one is collected, from its own running batch, and nothing else in the cluster reads or
changes its state in between — except at events: an arrival (routers, path and admission
policies read the tiers), a step of any other kind ending (a prefill joins the transfer queue
and the decode router reads the decode tier), a transfer landing, a scheduled event (fault,
flush, retry, restart) or a lease expiry. Up to the earliest of those (the horizon), the loop
need not take a turn per step: `_fast_forward` collects and re-dispatches those workers'
steps in end-time order, ties in worker order — exactly the order and the clock times at which
one turn per step would have made the same `_collect` and `_dispatch` calls — so the run's
tokens, timestamps, step records and samples are identical, byte for byte
(tests/scheduler/test_fast_forward.py compares both on several configurations). Every per-step
record is still made (the dispatch's sample, and the state sample after it: Driver._record_state):
what is skipped is the loop's per-turn work over all workers, which dominates at 64
instances. A step whose end ties with the horizon is left to the loop.

Off (one turn per step) for anything whose per-turn behaviour could differ: the wall clock, a
role-switch policy (it is asked every turn), online serving (inbox, listener), debug mode
(invariants checked every turn), instances slowing each other on a shared host, overlap.
A mixin of `Driver`; pure Python.
"""

from __future__ import annotations

import heapq
from collections import deque

from pdjax.errors import DeviceError
from pdjax.scheduler.instance_queue import EWMA, SlowPending, Step, InstanceQueue
from pdjax.scheduler.policies.no_role_switch import NoRoleSwitch


class FastForward:

  def _fast_forward_possible(self) -> bool:
    """Whether this run may fast-forward at all (checked once per run)."""
    return (self.opts.fast_forward and hasattr(self.clock, "advance_to")
            and not self.opts.debug and isinstance(self.policies.role_switch.policy, NoRoleSwitch)
            and self._inbox is None and self._listener is None
            and all(getattr(w.instance, "host", None) is None
                    and not getattr(w.instance, "device_tokens", False) for w in self.workers))

  def _chains(self, w: InstanceQueue) -> bool:
    """Whether w's next step depends only on w until the horizon (see the module)."""
    step = w.inflight
    return (step.kind == "decode" and w.ahead is None and not w.waiting and not w.reserved
            and w.draining_to is None)

  def _fast_forward(self, arrivals: deque, segments: bool = False) -> tuple[int, bool]:
    """Runs the decode chains up to the next event (see the module). Returns the number of
    steps it collected and whether the loop must take its next turn now, before waiting
    (a cancel that came up is applied at once, as one turn per step would).
    segments: the run may compute chains' steps many at once (scheduler/decode_segments.py)."""
    if (self._touched or self._cancels or self._restarting or self.transfer_queue
        or self._draining):
      return 0, False
    marks = (len(self.steps), len(self.samples))
    try:
      return self._fast_forward_steps(arrivals, segments and not self._cancel_plans)
    finally:
      if segments:
        self._end_segments(marks)

  def _fast_forward_steps(self, arrivals: deque, segments: bool) -> tuple[int, bool]:
    horizon = arrivals[0].arrival_s if arrivals else float("inf")
    wake = self._wake_s()
    if wake is not None:
      horizon = min(horizon, wake)
    for *_, transfer in self._pending_transfers:
      end = getattr(transfer, "end_s", None)
      if end is None:               # (pending objects without a virtual end: not simulated)
        return 0, False
      horizon = min(horizon, end)
    heap, now, segment_horizon = [], self.clock.now(), horizon
    for i, w in enumerate(self.workers):   # (_chains inlined: this scan runs every turn)
      step = w.inflight
      if step is None:
        continue
      end = getattr(step.pending, "end_s", None)
      if end is None:
        return 0, False
      if (step.kind == "decode" and w.ahead is None and not w.waiting and not w.reserved
          and w.draining_to is None):
        heap.append((end, i))
        if segments:          # (a chain that may preempt moves the horizon back: not past it)
          segment_horizon = min(segment_horizon, self._segments_until(w, now))
      elif end < horizon:
        horizon = end
    heapq.heapify(heap)
    segment_horizon = min(segment_horizon, horizon)
    collected = 0
    while heap and heap[0][0] < horizon:
      end = heap[0][0]
      batch = []
      while heap and heap[0][0] == end:
        batch.append(heapq.heappop(heap)[1])
      self.clock.advance_to(end)
      for i in batch:               # one turn collects every step done, in worker order ...
        self._collect_chained(self.workers[i])
      collected += len(batch)
      if self._cancels:             # (an injected cancel: the next turn applies it first)
        return collected, True
      if segments and segment_horizon <= end < horizon:   # (the bound passed: renew it)
        segment_horizon = min([horizon] + [self._segments_until(self.workers[j], end)
                                           for j in batch + [j for _, j in heap]])
      for i in batch:               # ... and the next dispatches the touched, in worker order
        self._touched.discard(i)
        w = self.workers[i]
        plan = None
        if segments:
          plan = self._dispatch_segment(w, i, segment_horizon)
          if isinstance(plan, int):
            collected += plan
            heapq.heappush(heap, (w.inflight.pending.end_s, i))
            continue
        sampled = len(self.samples)
        self._dispatch_chained(w, plan)
        self._record_state(w, sampled)
        if w.inflight is None:
          continue
        if self._chains(w):
          heapq.heappush(heap, (w.inflight.pending.end_s, i))
        else:                       # (a preemption queued a recompute: its step is an event)
          horizon = min(horizon, w.inflight.pending.end_s)
      if self._touched:             # a step failed at dispatch: re-planned after the next wait
        return collected, False
    return collected, False

  # ---- one chained step, collected and re-dispatched (the loop's _collect and _dispatch for
  # a worker that `_chains`: nothing queued, a decode step; kept equal to them by the tests) --

  def _collect_chained(self, w: InstanceQueue) -> None:
    step, w.inflight = w.inflight, None
    self._touched.add(self._index[id(w)])
    plan, pending = step.plan, step.pending
    done_s = self.clock.now()
    tokens = pending.result()
    now = self.clock.now()
    seconds = max(now - step.start_s, 1e-9)           # InstanceQueue.measure, for a decode step
    w.decode_step_s = seconds if w.decode_step_s is None else (
        (1 - EWMA) * w.decode_step_s + EWMA * seconds)
    since, w.host_wait_from = w.host_wait_from, None  # Collect._host_wait
    self.steps.add((w.name, w.role, "decode", step.start_s, now,   # records.STEP_FIELDS
                    len(plan.decodes), len(plan.decodes), False, step.dispatched_s, done_s,
                    step.plan_s, step.dispatch_s, getattr(pending, "build_s", 0.0),
                    now - done_s, 0.0 if since is None else max(step.start_s - since, 0.0)))
    cancel_plans = self._cancel_plans
    for req, token in zip(plan.decodes, tokens):
      if req.status.terminal:
        continue
      if token < 0:
        self._non_finite(w, req, token, now)
        continue
      out = req.output_ids             # Collect._emit without a listener (Request.add_token)
      out.append(int(token))
      req.token_times.append(now)
      if len(out) >= req.sampling.max_new_tokens or (
          not req.sampling.ignore_eos and out[-1] in req.eos_ids):
        self._finish_done(w, req, now)
      elif cancel_plans:
        self._maybe_cancel(req, "decode", len(out))
    w.host_wait_from = done_s if w.running or w.waiting else None

  def _dispatch_chained(self, w: InstanceQueue, plan=None) -> None:
    """plan: the step policy's plan for w now, when the caller made it already."""
    t0 = self.clock.now()
    if plan is None:
      plan = self.policies.step.plan(w, admit=_no_admission)
    if plan.chunks:
      raise AssertionError(f"{w.name} planned a prefill with nothing waiting")
    tables, decodes = w.tables, plan.decodes
    # Steps._ensure_decode_slots without a preemption; the general one if the pool is full
    # (extending a table again to the same length changes nothing)
    if tables.extend_each([r.id for r in decodes],
                          [r.prompt_len + len(r.output_ids) for r in decodes]) < len(decodes):
      self._ensure_decode_slots(w, plan, {})
    if self._offload_failed(w) or plan.empty:   # (extending evicts pages)
      return
    if len(plan.decodes) > w.max_batch:
      self._check_step_size(w, plan)
    now = self.clock.now()
    table = tables.pages_of
    rows = [(r.output_ids[-1], r.prompt_len + len(r.output_ids) - 1, table(r.id),
             r.sampling.temperature, r.sampling_seed, r.sampling.top_p) for r in plan.decodes]
    self.samples.add(w.state_sample(now))
    t1 = self.clock.now()
    try:
      pending, slow = w.instance.decode(rows), self.injector.slow_factor(w.name, now)
      t2 = self.clock.now()
      if slow > 1:
        self.injector.injected["slow_step"] += 1
        pending = SlowPending(pending, now, slow, self.clock)
      w.inflight = Step(plan, pending, t2, "decode", plan_s=t1 - t0, dispatch_s=t2 - t1,
                        dispatched_s=t2)
    except DeviceError as e:
      self._fail_plan(w, plan, f"decode step failed on {w.name}: {type(e).__name__}: {e}")


def _no_admission(req) -> bool:
  raise AssertionError(f"{req.id}: admission asked of a worker with nothing waiting")
