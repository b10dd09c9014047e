"""Dispatching a step on an idle worker: the step policy plans it, admitted prefills get their
pages (and, when they stay, their decode slot), decoding sequences grow by one slot each —
preempting the newest running sequence when the pool is full — and the step is launched
without waiting. No step larger than the worker's largest compiled bucket is ever launched.

Overlap: on an instance whose steps take device-resident input tokens (`device_tokens`), the
driver dispatches the next step while a decode step is still in flight (`ahead=True`). Its
rows for requests decoding in that step take their input token from its output on the device
(`PendingToken(row)`) at the next position; a request whose token in flight is its last
(max_new_tokens) gets no row, and one that turns out to stop there (EOS) has its extra row's
token dropped when collected. A step dispatched ahead never preempts: when the pool is full it
is not dispatched, and the step after the collection preempts as usual.
A mixin of `Driver`; pure Python."""

from __future__ import annotations

from pdjax.kv.pages import OutOfPages
from pdjax.request import PendingToken, Request, Status
from pdjax.errors import DeviceError
from pdjax.scheduler.instance_queue import SlowPending, Step, InstanceQueue
from pdjax.scheduler.policies.base import StepPlan


class Steps:

  def _dispatch(self, w: InstanceQueue, ahead: bool = False) -> None:
    t0 = self.clock.now()   # host phases on the run's clock (virtual in the simulator)
    if self._offload_failed(w):   # (while a collection or a transfer evicted pages)
      return
    rows = w.inflight.token_rows() if ahead else {}   # requests whose input token is pending
    plan = self.policies.step.plan(w, admit=lambda r: self._allocate_prefill(w, r))
    # A request being cancelled gets no new row (while a step holds it, it is not dropped);
    # nor does one whose token in flight is its last (max_new_tokens).
    plan.decodes = [r for r in plan.decodes if id(r) not in self._cancels and (
        id(r) not in rows or len(r.output_ids) + 1 < r.sampling.max_new_tokens)]
    fits = not plan.decodes or self._ensure_decode_slots(w, plan, rows, preempt=not ahead)
    if self._offload_failed(w) or not fits or plan.empty:   # planning evicts pages
      return
    self._check_step_size(w, plan)
    now = self.clock.now()
    for req, _, _ in plan.chunks:
      if req.prefill_start_s is None:
        req.prefill_start_s = now
      if not req.output_ids:
        req.status = Status.PREFILLING
      self._maybe_cancel(req, "prefill")
    # (an instance that reads the rows' tables during the call and keeps none, the simulator's,
    # gets the tables themselves; others a copy: the next step may grow them while it runs)
    table = (w.tables.pages_of if getattr(w.instance, "reads_tables_at_once", False)
             else w.tables.block_table)
    decode_rows = []
    for r in plan.decodes:
      if id(r) in rows:    # its input is the token in flight, one position on
        token, pos = PendingToken(rows[id(r)]), r.prompt_len + len(r.output_ids)
      else:
        token, pos = r.output_ids[-1], r.prompt_len + len(r.output_ids) - 1
      decode_rows.append((token, pos, table(r.id), r.sampling.temperature, r.sampling_seed,
                          r.sampling.top_p))
    prev = (getattr(w.inflight.pending, "inner", w.inflight.pending),) if ahead else ()
    bound = []
    if plan.chunks:
      kind = "mixed" if plan.decodes else "prefill"
      seqs = [(req.prefill_tokens[start:end], start, table(req.id), req.sampling.temperature,
               req.sampling_seed, req.sampling.top_p) for req, start, end in plan.chunks]
      seqs += [([tok], *rest) for tok, *rest in decode_rows]
      bound = self._bind_streams(w, plan)   # KV streamed while it computes (streams.py)
      if bound:
        streams = self._stream_calls(w, bound)
        call = lambda: w.instance.prefill(seqs, *prev, streams=streams)
      else:
        call = lambda: w.instance.prefill(seqs, *prev)
    else:
      kind, call = "decode", lambda: w.instance.decode(decode_rows, *prev)
    tables = w.tables   # (records.SAMPLE_FIELDS; the node's host KV tier as this dispatch saw it)
    self.samples.add((now, w.name, w.role, w.num_waiting(), len(w.running),
                      tables.num_used_pages, w.total_pages(), tables.num_cached_idle_pages,
                      tables.num_unused_slots, None if tables.host is None else len(tables.host)))
    t1 = self.clock.now()
    try:
      pending, slow = call(), self.injector.slow_factor(w.name, now)
      t2 = self.clock.now()
      if slow > 1:
        self.injector.injected["slow_step"] += 1
        pending = SlowPending(pending, now, slow, self.clock)
      step = Step(plan, pending, t2, kind, plan_s=t1 - t0, dispatch_s=t2 - t1, ahead=ahead,
                  dispatched_s=t2, streams=bound)
      if ahead:
        w.ahead = step
      else:
        w.inflight = step
    except DeviceError as e:  # a device failure fails the step's requests, never the run
      self._release_streams(bound)
      self._fail_plan(w, plan, f"{kind} step failed on {w.name}: {type(e).__name__}: {e}")

  def _offload_failed(self, w: InstanceQueue) -> bool:
    """Whether w's device failed copying an evicted prefix page to the host tier (evictions
    happen while planning, collecting or transferring, outside any step's DeviceError guard;
    the prefix cache keeps the error: PrefixCache.on_drop). Such an instance is lost like one
    whose process died: it is killed, its requests recomputed on live instances or failed."""
    cache = w.tables.cache
    error = cache.take_offload_error() if cache is not None else None
    if error is None or w.dead:
      return error is not None
    self._kill(w, why=f"died (host-tier offload failed: {type(error).__name__}: {error})",
               injected=False)
    return True

  def _can_dispatch_ahead(self, w: InstanceQueue) -> bool:
    """Whether the next step may be dispatched now, before the step in flight is collected:
    only after a decode step (its requests' next positions are known; a prefill chunk's
    progress is settled at collection) on an instance whose steps take device tokens, unless
    the step in flight was itself dispatched ahead of a step that failed (its tokens will not
    come: Collect)."""
    return (self.opts.overlap and w.inflight is not None and w.ahead is None
            and not w.inflight.plan.chunks and getattr(w.instance, "device_tokens", False)
            and self._ahead_of_failed.get(id(w)) is not w.inflight)

  def _check_step_size(self, w: InstanceQueue, plan: StepPlan) -> None:
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

  def _allocate_prefill(self, w: InstanceQueue, r: Request) -> bool:
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
      if w.tables.cache is not None:
        self.tally.prefix_lookup(w.name, r.prompt_len, cached)
    return True

  def _ensure_decode_slots(self, w: InstanceQueue, plan: StepPlan, pending: dict,
                           preempt: bool = True) -> bool:
    """Grows each decoding sequence's block table by the slot its next token needs (one more
    for a request whose token is `pending` in flight); when the pool is full, preempts the
    newest running sequence (recompute later) until it fits. Without `preempt` (a step
    dispatched ahead) a full pool returns False instead."""
    rows = plan.decodes
    first = w.tables.extend_each([r.id for r in rows], [
        r.prompt_len + len(r.output_ids) + (id(r) in pending) for r in rows])
    if first == len(rows):   # (the usual case: every row fits; else the rest one by one)
      return True
    preempted: set[int] = set()
    for r in list(rows[first:]):
      if id(r) in preempted:
        continue
      while True:
        try:
          w.tables.extend(r.id, r.prompt_len + len(r.output_ids) + (id(r) in pending))
          break
        except OutOfPages:
          if not preempt:
            return False
          victim = self._victim(w, r)
          self._preempt(w, victim, plan)
          preempted.add(id(victim))
          if victim is r:
            break
    return True

  @staticmethod
  def _victim(w: InstanceQueue, r: Request) -> Request:
    """Whom a decoding r that needs a page preempts: the newest other running sequence, else
    the last prefill or recompute under way here (holding pages, no token yet to lose), else
    r itself. Before the second choice, two sequences that each need most of the pool took
    turns preempting themselves while the other recomputed, and neither ever got a token (a
    livelock hypothesis found: tests/scheduler/test_load_capacity.py)."""
    victim = next((v for v in reversed(w.running) if v is not r), None)
    if victim is None:
      victim = next((v for v in reversed(w.waiting) if v is not r and v.id in w.tables), r)
    return victim

  def _preempt(self, w: InstanceQueue, victim: Request, plan: StepPlan) -> None:
    w.tables.free(victim.id, self.clock.now())
    if victim in w.running:
      w.running.remove(victim)
    else:            # (a prefill or recompute under way: starts over, its slot claimed again
      w.waiting.remove(victim)         #  with its pages: _allocate_prefill)
      w.release(victim)
    if victim in plan.decodes:
      plan.decodes.remove(victim)
    plan.chunks[:] = [c for c in plan.chunks if c[0] is not victim]   # (its chunk, if any)
    victim.num_computed_tokens = 0
    victim.preemptions += 1
    victim.status = Status.WAITING
    # First in line to recompute, but behind the waiting requests already holding pages here
    # (prefills under way): a victim the pool cannot admit ahead of them would block them,
    # and they would never free the pages it waits for (a deadlock hypothesis found).
    ahead = 0
    while ahead < len(w.waiting) and w.waiting[ahead].id in w.tables:
      ahead += 1
    w.waiting.insert(ahead, victim)
    self.preemptions += 1
