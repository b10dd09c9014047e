"""How the driver's loop waits for its steps and transfers (a mixin of Driver): on the virtual
clock it jumps to the next end or event; on a real one it polls, or blocks in the pending
objects' shared `wait_any` for at most BLOCK_MAX_S, and kills an instance whose step is hung
past `step_timeout_s`."""

from __future__ import annotations

import logging
import time

from pdjax.scheduler.instance_queue import InstanceQueue

POLL_S = 0.0002   # how often the loop checks in-flight steps when none is done
BLOCK_MAX_S = 0.01   # longest blocking wait on pending objects that can block (see _block)


class Waiting:

  def _wait_any(self, inflight: list[InstanceQueue],
                wake: float | None = None) -> list[InstanceQueue]:
    """The in-flight workers whose step is done, polling until at least one is or until
    `wake` (an event or lease expiry is due)."""
    if not inflight and not self._pending_transfers and not self._restarting:
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
          (self._inbox is not None and self._inbox.pending()) or \
          any(t.ready() for *_, t in self._pending_transfers) or \
          any(p.ready() for _, p in self._restarting.values()):
        return ready
      if self._hung(inflight):
        return []
      self._block(inflight, wake)

  def _block(self, inflight: list[InstanceQueue], wake: float | None) -> None:
    """Waits a little for something in flight: POLL_S, or, when every pending object offers
    the same `wait_any(pendings, timeout_s)` (the engine's steps and transfers:
    pdjax/engine/ready_wait.py; Ray futures: pdjax/distributed), blocks in it until one may
    be ready, at most BLOCK_MAX_S (so deadlines and wake-ups stay on time) — a polling driver
    takes CPU from the steps it waits for (in this process or the instances')."""
    pendings = ([w.inflight.pending for w in inflight]
                + [t for *_, t in self._pending_transfers]
                + [p for _, p in self._restarting.values()])
    wait = getattr(pendings[0], "wait_any", None) if pendings else None
    if wait is None or any(getattr(p, "wait_any", None) is not wait for p in pendings):
      time.sleep(POLL_S)
      return
    left = BLOCK_MAX_S if wake is None else min(BLOCK_MAX_S, wake - self.clock.now())
    wait(pendings, max(left, 0.0))

  def _hung(self, inflight: list[InstanceQueue]) -> bool:
    """Kills every instance whose step has not completed within step_timeout_s: a device (or
    its runtime) that stopped answering must end the run's wait, not hang it."""
    limit, now = self.opts.step_timeout_s, self.clock.now()
    hung = [w for w in inflight if limit and now - w.inflight.start_s > limit]
    for w in hung:
      logging.warning("%s: a %s step has not completed in %.0f s; treating the instance as "
                      "dead", w.name, w.inflight.kind, limit)
      self._kill(w, why=f"hung (a step not done in {limit:g} s)", injected=False)
    return bool(hung)
