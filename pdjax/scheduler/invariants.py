"""The driver's invariant checks (after every loop turn with `debug`; the end-of-run checks
are in `Driver.run` and `pdjax.runner.serve_requests.check_end_state`). A mixin of `Driver`;
pure Python."""

from __future__ import annotations

from pdjax.scheduler.instance_queue import InstanceQueue


class Invariants:

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

  def _check_slots(self, w: InstanceQueue) -> None:
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
