"""Decode segments (the simulator): a fast-forwarded worker's steps up to its next event,
computed at once instead of one collect-and-dispatch per step.

In a fast-forward (scheduler/fast_forward.py) a chaining worker's steps depend on nothing but
its own batch until the horizon. When its batch cannot change either — no row reaches its
max_new_tokens or a stop token, no page comes from anywhere but its free list — its next steps
are a pure function of that batch: their end times are the cost model's over all of them
(`pdjax/sim/decode_chain.py`), their tokens the digest chain over the batch, their pages the
block tables grown round by round (BlockTables.extend_steps). A segment makes them at once:
the steps that end before the horizon are collected (tokens and their times appended, the
step records and state samples made, the step-time average updated) and the next one is left
in flight, a real step the loop or the fast-forward collects like any other — the one whose
collection ends a row (a finished request) always is.

What one step at a time would have done is kept exactly: the records the fast-forward made
are merged with the segments' in the order one step at a time appends them (steps by end
time, samples by time, ties in worker order), and no other worker may move the horizon back
past a point a segment already ran to: segments stop where any chaining worker could first
preempt (the one way a chained step stops chaining; `_segments_until`), and are off while a
client cancel is planned. Off for workers
on a shared host, with a host KV tier or an injected slowdown, for spilled records, and for a
step policy whose decode rows are not a function of the running batch alone.
tests/scheduler/test_fast_forward.py compares the outputs byte for byte. A mixin of
`Driver`; pure Python.
"""

from __future__ import annotations

from pdjax.scheduler.fast_forward import _no_admission
from pdjax.scheduler.instance_queue import EWMA, InstanceQueue, Step
from pdjax.scheduler.segment_records import SegmentRecords

SEGMENT_MIN_STEPS = 4   # fewer steps expected before the event: one at a time is cheaper


class DecodeSegments:

  def _segments_possible(self) -> bool:
    """Whether this run may use segments at all (checked once per run)."""
    return (self.spill_dir is None
            and getattr(self.policies.step, "decodes_follow_running", False))

  def _segments_until(self, w: InstanceQueue, now: float) -> float:
    """Until when other workers' segments may run ahead of chaining worker w: no earlier than
    this can w's chain preempt (the one way it stops chaining, moving the horizon back).
    Infinite where w's free pages cover its running sequences to their max_new_tokens; else
    each sequence takes at most one page per page_size steps, and no step is shorter than
    the instance's floor. Kept until w is touched or the time passes (a bound from an earlier
    time holds as long as w chains)."""
    until = w.chain_safe_until
    if until is None or until <= now:
      until = w.chain_safe_until = self._safe_until(w, now)
    return until

  def _safe_until(self, w: InstanceQueue, now: float) -> float:
    tables = w.tables
    floor = getattr(w.instance, "decode_floor_s", None)
    if tables.host is not None or floor is None:
      return now            # (evictions to the host tier may fail: the loop takes over)
    free, need = tables.allocator.num_free, 0
    for r in w.running:
      final = tables.pages_needed(r.prompt_len + r.sampling.max_new_tokens)
      need += max(final - len(tables.pages_of(r.id)), 0)
    if need <= free:
      return float("inf")
    return now + tables.page_size * (free // max(len(w.running), 1)) * floor

  def _segment_capable(self, w: InstanceQueue) -> bool:
    return (getattr(w.instance, "decode_chains", False) and w.tables.host is None
            and not any(name == w.name for name, *_ in self.injector.spec.slow_instances))

  def _begin_segments(self) -> None:
    """Once per run: the segments' records wait aside (scheduler/segment_records.py) until
    the run ends."""
    self._segment_records = SegmentRecords()
    self._segment_until = 0.0        # the latest collection a segment made

  def _end_segments(self, marks: tuple[int, int]) -> None:
    """At a fast-forward's exit: the segments' records made during it belong among the run's
    records made since `marks`, in the order one step at a time makes them (merged once, at
    the end of the run: _settle_segments)."""
    self._segment_records.close_window(marks, (len(self.steps), len(self.samples)))
    self.clock.advance_to(self._segment_until)

  def _settle_segments(self) -> None:
    self._segment_records.merge_into(self.steps, self.samples,
                                     {w.name: i for i, w in enumerate(self.workers)})

  def _dispatch_segment(self, w: InstanceQueue, i: int, horizon: float):
    """Runs w's steps from now (it was just collected) up to its next event as one segment;
    returns the steps it collected (an int), or where a segment would not pay (or cannot run)
    None or the step plan it made, for the caller to dispatch one step (with that plan)."""
    now, step_s = self.clock.now(), w.decode_step_s
    if (step_s is None or horizon - now < SEGMENT_MIN_STEPS * step_s
        or not self._segment_capable(w)):
      return None
    plan = self.policies.step.plan(w, admit=_no_admission)
    rows = plan.decodes
    if plan.chunks or not rows or len(rows) > w.max_batch:
      return plan
    remaining = min(r.sampling.max_new_tokens - len(r.output_ids) for r in rows)
    if remaining < SEGMENT_MIN_STEPS or any(r.status.terminal for r in rows):
      return plan
    inst, tables, n = w.instance, w.tables, len(rows)
    positions = [r.prompt_len + len(r.output_ids) - 1 for r in rows]
    # (a horizon so far ahead that the step count overflows, e.g. workload.rate=1e-300: capped)
    expected = (remaining if horizon == float("inf")
                else int(min((horizon - now) / step_s, 2.0 ** 31)) + 2)
    ends = inst.chain_ends(n, sum(positions) + n, now, remaining, horizon, min(expected, 4096))
    if len(ends) < 2:
      return plan
    pages = [tables.pages_of(r.id) for r in rows]   # (the tables themselves: they grow)
    stops = [frozenset() if r.sampling.ignore_eos else frozenset(r.eos_ids) for r in rows]
    tokens, chain = inst.chain_tokens([r.output_ids[-1] for r in rows], positions, pages,
                                      len(ends), stops)
    m = len(tokens[0])          # steps dispatched: m - 1 collected here, the last in flight
    ends = ends[:m]
    used, unused = tables.extend_steps([r.id for r in rows], [p + 1 for p in positions], m)
    inst.write_chain(positions, pages, chain)
    starts = [now] + ends[:-1]
    name, role, running = w.name, w.role, len(w.running)
    total, cached = tables.allocator.num_pages, tables.num_cached_idle_pages
    done = ends[:-1]
    self._segment_records.add(name, role, n, running, total, cached, starts, done, used, unused)
    if done:
      for r, emitted in zip(rows, tokens):
        r.output_ids.extend(emitted[:-1])
        r.token_times.extend(done)
      average = w.decode_step_s
      for s, e in zip(starts, done):   # InstanceQueue.measure, step by step
        seconds = max(e - s, 1e-9)
        average = seconds if average is None else (1 - EWMA) * average + EWMA * seconds
      w.decode_step_s = average
      w.host_wait_from = done[-1]
      self._segment_until = max(self._segment_until, done[-1])
    pending = inst.start_step(ends[-1], [row[-1] for row in tokens])
    w.inflight = Step(plan, pending, starts[-1], "decode", plan_s=0.0, dispatch_s=0.0,
                      dispatched_s=starts[-1])
    w.latest_sample = (starts[-1], name, role, 0, running, used[-1], total, cached,
                       unused[-1], None)
    self.segment_steps += len(done)
    return len(done)
