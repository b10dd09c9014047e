"""What the driver does when things go wrong: client cancellations, KV transfers that fail or
stall, KV held too long for a decode instance that never pulls it, and instances that die
(and come back). A mixin of `Driver` (it reads and changes the driver's queues); pure Python.

Every request still ends in exactly one terminal state and every page returns to its pool:
  - cancel (any stage): removed from its queue, its pages freed on every tier; a request in a
    step or transfer in flight is cancelled when that step or transfer ends.
  - transfer failure: the prefill pages stay; retried after a backoff (doubling) up to
    `transfer_retries` times, then `transfer_failure_policy` decides: "retry_then_recompute"
    recomputes the KV on a decode instance (a recorded fallback), "fail" fails the request.
  - lease: prefill-side KV that no decode instance pulled within `lease_s` is reclaimed and
    the request fails with the reason.
  - a dead instance: its step in flight is lost, its pages and cache are gone; its queued
    requests go to another live instance of the tier, its decoding requests are recomputed
    there (fallbacks); with none left, they fail with the reason. Routers never see a dead
    instance; a restarted one comes back empty, and one whose new process fails to start
    (DeviceError, InstanceLost) stays dead, logged and counted (`restarts_failed`).
"""

from __future__ import annotations

import heapq
import logging

from pdjax.request import Request, Status
from pdjax.errors import DeviceError
from pdjax.scheduler.streams import abandon_transfer

FALLBACK_TRANSFER = "transfer_failed:recompute_on_decode"
FALLBACK_DEATH = "instance_died:rerouted"
FALLBACK_DEATH_RECOMPUTE = "instance_died:recomputed"

logger = logging.getLogger(__name__)


class Recovery:

  # ---- timed events (flushes, kills, restarts, transfer retries) ---------------------------

  def _init_recovery(self) -> None:
    self._events: list[tuple[float, int, str, object]] = []
    self._event_seq = 0
    self._cancels: dict[int, tuple[Request, str]] = {}   # id(req) -> (req, stage)
    self._cancel_plans: dict[int, tuple[str, int]] = {}
    self._attempts: dict[int, int] = {}                  # id(req) -> failed transfer attempts
    self._held_since: dict[int, float] = {}              # id(req) -> entered transfer queue
    self._retrying: dict[int, tuple[Request, object]] = {}
    self._in_transfer: dict[int, tuple[Request, object, object]] = {}   # delayed, in flight
    self._pending_transfers: list = []    # (req, src, dst, pending) dispatched, not landed
    self._restarting: dict[int, tuple] = {}   # id(worker) -> (worker, its start in progress)
    self._ahead_of_failed: dict[int, object] = {}   # id(worker) -> its step in flight, which
                                                    # went ahead of a step that failed
    self.transfers_landed = 0
    self.transfer_errors: dict[str, int] = {}   # device-error reason -> failed attempts
    self.fault_counts: dict[str, int] = {"transfer_retries": 0, "transfers_recovered": 0,
                                         "pages_reclaimed_by_lease": 0,
                                         "pages_lost_with_instances": 0, "instances_killed": 0,
                                         "instances_restarted": 0}
    for t, tenant in self.opts.flush_schedule:
      self._schedule(t, "flush", tenant)
    for name, t in self.injector.spec.kills:
      if name in self._by_name:            # a fault names instances of the runs that have them
        self._schedule(t, "kill", name)

  def _schedule(self, t: float, kind: str, payload) -> None:
    heapq.heappush(self._events, (t, self._event_seq, kind, payload))
    self._event_seq += 1

  def _next_event_s(self) -> float | None:
    return self._events[0][0] if self._events else None

  def _run_events(self, now: float, only: tuple[str, ...] | None = None) -> None:
    while self._events and self._events[0][0] <= now:
      _, _, kind, payload = heapq.heappop(self._events)
      if only is not None and kind not in only:
        continue
      if kind == "flush":
        self.flush_tenant(payload)
      elif kind == "kill":
        self._kill(self._by_name[payload])
      elif kind == "restart":
        self._restart(self._by_name[payload])
      elif kind == "retry":
        self._retry(*payload)
      elif kind == "land":
        self._land(*payload)
      elif kind == "remesh":
        self._rejoin(payload)

  def _wake_s(self) -> float | None:
    """The earliest time something is due besides arrivals: an event or a lease expiry."""
    times = [t for t in (self._next_event_s(), self._remesh_wake_s()) if t is not None]
    if self.opts.lease_s and self._held_since and self._switch is None:
      times.append(min(self._held_since.values()) + self.opts.lease_s)
    return min(times) if times else None

  # ---- cancellation ------------------------------------------------------------------------

  def cancel(self, req: Request, stage: str = "client") -> None:
    """A client aborts req: it ends CANCELLED as soon as no step or transfer in flight holds
    it, freeing everything it held."""
    if not req.status.terminal:
      self._cancels.setdefault(id(req), (req, stage))

  def _plan_cancel(self, req: Request) -> None:
    plan = self.injector.cancel_plan(req)
    if plan:
      self._cancel_plans[id(req)] = plan
      self._maybe_cancel(req, "queued")

  def _maybe_cancel(self, req: Request, stage: str, tokens: int = 0) -> None:
    plan = self._cancel_plans.get(id(req))
    if plan and plan[0] == stage and (stage != "decode" or tokens >= plan[1]):
      del self._cancel_plans[id(req)]
      self.injector.injected["cancel"] += 1
      self.cancel(req, stage)

  def _inflight_ids(self) -> set[int]:
    ids = set(self._in_transfer)
    for w in self.workers:
      for step in w.steps_in_flight():
        ids.update(id(r) for r, _, _ in step.plan.chunks)
        ids.update(id(r) for r in step.plan.decodes)
    return ids

  def _apply_cancels(self) -> None:
    if not self._cancels:
      return
    busy = self._inflight_ids()
    for key, (req, stage) in list(self._cancels.items()):
      if req.status.terminal:
        del self._cancels[key]
      elif key not in busy:
        del self._cancels[key]
        self._drop_everywhere(req)
        self._finish(req, Status.CANCELLED, self.clock.now(),
                     f"cancelled by the client ({stage})")

  def _drop_everywhere(self, req: Request) -> None:
    """Removes req from every queue and frees its pages on every instance."""
    now = self.clock.now()
    for w in self.workers:
      w.forget(req)
      if req.id in w.tables:
        w.tables.free(req.id, now)
        self._touch(w)
    self.transfer_queue = type(self.transfer_queue)(
        (r, s) for r, s in self.transfer_queue if r is not req)
    self._held_since.pop(id(req), None)
    self._retrying.pop(id(req), None)
    self._in_transfer.pop(id(req), None)
    self._kv_on_decode.discard(id(req))
    still = []
    for t in self._pending_transfers:
      if t[0] is req:
        abandon_transfer(t[3])              # (a pull in flight never lands in freed pages)
      else:
        still.append(t)
    self._pending_transfers = still

  # ---- KV transfer failures and leases -----------------------------------------------------

  def _transfer_failed(self, r: Request, src, dst, why: str) -> None:
    """One failed attempt: dst's pages go back; retry later, or give up (policy)."""
    now = self.clock.now()
    if dst is not None:
      dst.release(r)
      if r.id in dst.tables:
        dst.tables.free(r.id, now)
      self._touch(dst)
    attempts = self._attempts.get(id(r), 0) + 1
    self._attempts[id(r)] = attempts
    if attempts <= self.opts.transfer_retries:
      self.fault_counts["transfer_retries"] += 1
      self._retrying[id(r)] = (r, src)
      self._schedule(now + self.opts.transfer_backoff_s * 2 ** (attempts - 1), "retry", (r, src))
      return
    self._attempts.pop(id(r), None)
    if self.opts.transfer_failure_policy == "fail":
      src.tables.free(r.id, now)
      self._touch(src)
      self._finish(r, Status.FAILED, now,
                   f"kv transfer failed after {attempts} attempt(s): {why}")
      return
    src.tables.free(r.id, now)
    self._touch(src)
    self._recompute_on(r, "decode", FALLBACK_TRANSFER,
                       f"kv transfer failed after {attempts} attempt(s) ({why})")

  def _retry(self, r: Request, src) -> None:
    if self._retrying.pop(id(r), None) is None or r.status.terminal:
      return
    if getattr(src, "dead", False) or r.id not in src.tables:
      self._recompute_on(r, "decode", FALLBACK_DEATH_RECOMPUTE, f"{src.name} died")
      return
    self.transfer_queue.appendleft((r, src))

  def _land(self, r: Request, src, dst, skip: int, why: str | None) -> None:
    """A delayed transfer attempt arrives (or times out). Either end may have died meanwhile."""
    self._in_transfer.pop(id(r), None)
    if r.status.terminal:
      return
    if src.dead or r.id not in src.tables:
      self._drop_everywhere(r)
      self._recompute_on(r, "decode", FALLBACK_DEATH_RECOMPUTE, f"{src.name} died")
      return
    if dst.dead or r.id not in dst.tables:
      dst.release(r)
      if r.id in dst.tables:
        dst.tables.free(r.id, self.clock.now())
      self.transfer_queue.appendleft((r, src))   # pick another decode instance
      self._held_since[id(r)] = self.clock.now()
      return
    self._complete_transfer(r, src, dst, skip, why)

  def _check_request_state_released(self) -> None:
    """At the end of a run no request's recovery bookkeeping is left: entries keyed by
    id(request) that outlive their request grow a long-lived server without bound and, once
    the id is reused by a new request, hand it the old one's retries."""
    stale = {name: len(d) for name, d in (("transfer attempts", self._attempts),
                                          ("retries", self._retrying)) if d}
    if stale:
      raise AssertionError(f"recovery state outlived its requests at the end of the run: {stale}")

  def _transfer_succeeded(self, r: Request) -> None:
    if self._attempts.pop(id(r), 0):
      self.fault_counts["transfers_recovered"] += 1

  def _reclaim_leases(self, now: float) -> None:
    lease = self.opts.lease_s
    if not lease or not self._held_since or self._switch is not None:
      return     # (a re-mesh holds the pulls: the leases restart when it ends, _end_switch)
    # the same sum as the wake time in _wake_s, so waking at it always reclaims
    expired = [(r, s) for r, s in self.transfer_queue
               if id(r) in self._held_since and now >= self._held_since[id(r)] + lease]
    for r, src in expired:
      pages = len(src.tables.block_table(r.id))
      self._drop_everywhere(r)
      self.fault_counts["pages_reclaimed_by_lease"] += pages
      self._finish(r, Status.FAILED, now, f"KV lease of {lease:g} s expired on {src.name}: "
                   f"no decode instance pulled it")

  # ---- dead instances ----------------------------------------------------------------------

  def _kill(self, w, why: str = "died", injected: bool = True) -> None:
    """w is lost (an injected kill, or a step that never completed): its requests are
    recomputed on live instances of its tier, or fail when none is left."""
    if w.dead:
      return
    now = self.clock.now()
    w.dead, self._tiers = True, None
    kill = getattr(w.instance, "kill", None)   # an instance in its own process: end it for
    if kill is not None:                        # real (a Ray actor; see pdjax/distributed)
      kill()
    self.fault_counts["instances_killed"] += 1
    if injected:
      self.injector.injected["kill_instance"] += 1
    if w in self._draining:
      self._draining.remove(w)
      w.draining_to = None
    for step in (w.inflight, w.ahead):     # KV they streamed to decode instances: released
      if step is not None and step.streams:
        self._release_streams(step.streams, step.pending)
    w.inflight = w.ahead = None            # its steps' results are lost with the device
    self._ahead_of_failed.pop(id(w), None)
    victims = list(w.waiting) + list(w.running)
    lost = [(r, s) for r, s in self.transfer_queue if s is w]
    lost += [(r, s) for r, s in self._retrying.values() if s is w]
    w.waiting.clear()
    w.running.clear()
    w.reserved.clear()        # transfers still flying here are sent elsewhere when they land
    self.fault_counts["pages_lost_with_instances"] += w.tables.reset(now)
    if w.tables.host is not None:   # its host-tier writes still in flight never land
      w.tables.host.drop_writer(w.name, now)
    for r, _ in lost:
      self._drop_everywhere(r)
    for r in victims:
      self._drop_everywhere(r)
      role = w.role if w.role != "prefill" or not r.output_ids else "decode"
      self._recompute_on(r, role, FALLBACK_DEATH_RECOMPUTE if r.output_ids else FALLBACK_DEATH,
                         f"{w.name} {why}")
    for r, _ in lost:                      # prefilled, KV gone before it moved
      self._recompute_on(r, "decode", FALLBACK_DEATH_RECOMPUTE, f"{w.name} {why}")
    if self.injector.spec.restart_s:
      self._schedule(now + self.injector.spec.restart_s, "restart", w.name)

  def _restart(self, w) -> None:
    restart = getattr(w.instance, "restart", None)
    if restart is not None:   # a fresh process starting (and warming up) in the background:
      self._restarting[id(w)] = (w, restart())   # back once it is up (_poll_restarts)
      return
    self._back(w)

  def _poll_restarts(self) -> None:
    for key, (w, pending) in list(self._restarting.items()):
      if pending.ready():
        del self._restarting[key]
        try:
          pending.result()
        except DeviceError as e:   # InstanceLost included: the new process died starting
          self._restart_failed(w, e)
          continue
        self._back(w)

  def _restart_failed(self, w, error: DeviceError) -> None:
    """w's new process never came up: w stays dead (its requests already moved when it died,
    and routers do not see it), what was started of it is ended, and the run goes on."""
    logger.warning("%s: its restart failed (%s: %s); the instance stays dead", w.name,
                   type(error).__name__, error)
    self.fault_counts["restarts_failed"] = self.fault_counts.get("restarts_failed", 0) + 1
    kill = getattr(w.instance, "kill", None)
    if kill is not None:
      kill()

  def _back(self, w) -> None:
    w.dead, self._tiers = False, None
    self.fault_counts["instances_restarted"] += 1
    self._touch(w)

  def _recompute_on(self, r: Request, role: str, fallback: str, why: str) -> None:
    """Queues r on a live instance of `role` to (re)compute its KV from its tokens; fails it
    when there is none."""
    now = self.clock.now()
    if id(r) in self._cancels:
      req, stage = self._cancels.pop(id(r))
      self._finish(r, Status.CANCELLED, now, f"cancelled by the client ({stage})")
      return
    r.num_computed_tokens = 0
    r.status = Status.WAITING
    tier = self.tier(role)
    router = self.policies.decode_router if role == "decode" else self.policies.prefill_router
    if not tier and self._park(r, role, fallback, why):
      return     # the tier is being re-meshed: r waits for its new instances
    target = router.choose(r, tier) if tier else None
    if target is None:
      self._finish(r, Status.FAILED, now, f"{why} and no live instance is left in the {role} tier")
      return
    self.tally.fallback(fallback, r.fallbacks)
    r.fallbacks.append(fallback)
    if r.output_ids:
      r.decode_instance = target.name
    target.waiting.append(r)
    self._touch(target)
