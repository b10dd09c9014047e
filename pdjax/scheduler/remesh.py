"""Re-meshing a tier live (`scheduler.role_switch=remesh`): the tier's instances are replaced
by `count` instances at `tp` on the same devices, e.g. two decode instances at TP1 by one at
TP2. A mixin of `Driver`; pure Python (the instances come from a builder: the engine's,
pdjax/engine/remesh.py, or the simulator's, pdjax/sim/remesh.py).

One switch at a time, in phases (each timed in the run's `remesh_events`):
  drain    the old instances stop taking work (routers no longer see them). With
           `scheduler.remesh_drain=migrate` they stop stepping and the phase ends once their
           steps and KV transfers in flight are done; with `finish` they serve what they hold
           until every request on them has finished.
  reshard  the builder makes the new instances on the same devices, their weights resharded
  compile  from the device copies already there, their programs from the compile cache.
  migrate  (migrate) each request decoding on an old instance has its KV moved to a new one
           with the run's KV transfer (TP change included); queued requests are requeued
           there (a partly prefilled one starts over), prefilled KV waiting for a decode
           instance moves too. One that no new pool can hold is recomputed there.
  rejoin   the old instances are released, the new ones join the tier.
The old instances are released only once the new ones are built: a failure while building
(DeviceError) leaves the old ones serving, recorded in the event. While a tier has no instance
serving, arrivals that would need it wait (not rejected), as do requests to recompute there.
On the virtual clock the builder's modelled phase times pass before the rejoin; on the wall
clock they already have (the loop waits for the build: the other tier's steps run on, and are
collected after it).
"""

from __future__ import annotations

from pdjax.request import Request, Status
from pdjax.errors import DeviceError
from pdjax.scheduler.instance_queue import InstanceQueue
from pdjax.scheduler.policies.always_disagg import AlwaysDisagg


class _Retired:
  """What a replaced worker keeps of its instance: its name, TP and (empty) page tables. The
  instance itself may serve again under another name (the engine's standby instances)."""

  def __init__(self, instance):
    self.name, self.tp, self.tables = instance.name, getattr(instance, "tp", 1), instance.tables


class _Switch:
  """A re-mesh under way."""

  def __init__(self, plan, old: list, start_s: float, drain: str):
    self.plan, self.old, self.start_s, self.drain = plan, old, start_s, drain
    self.new: list[InstanceQueue] = []
    self.phases: dict[str, float] = {}
    self.built_s: float | None = None
    self.parked: list[tuple[Request, str, str]] = []   # (request, fallback, why) to recompute
    self.migrated = self.requeued = self.recomputed = 0
    self.landing: list = []   # (request, old worker, transfer) landing by the rejoin (virtual)
    self.queued: list = []    # (request, new worker): prefilled KV moved, to transfer after
    self.event = {"t_s": start_s, "role": plan.role,
                  "from": f"{len(old)}x{old[0].tp}", "to": plan.layout, "reason": plan.reason,
                  "drain": drain, "instances_from": [w.name for w in old]}


class Remesh:

  def _init_remesh(self, builder, drain: str) -> None:
    if drain not in ("migrate", "finish"):
      raise ValueError(f"scheduler.remesh_drain must be migrate or finish, got {drain!r}")
    self._remesh_builder, self._remesh_drain = builder, drain
    policy = self.policies.role_switch.policy   # (the policy itself, not its guard)
    cost_of = getattr(builder, "cost_of", None)
    if hasattr(policy, "cost_of") and cost_of is not None:
      policy.cost_of, policy.switch_s = cost_of, builder.switch_s   # predicted decisions
    self._switch: _Switch | None = None
    self._kv_on_decode: set[int] = set()   # id(request): its KV waits on a new decode instance
    self.remesh_events: list[dict] = []
    self.instances_used = [w.instance for w in self.workers]   # the new ones appended

  # ---- the loop's hooks ------------------------------------------------------------------

  def _remesh_turn(self) -> None:
    """Starts a re-mesh the policy asks for, or moves the one under way on."""
    if self.mode != "disaggregated" or self._remesh_builder is None:
      return
    now = self.clock.now()
    if self._switch is None:
      policy = self.policies.role_switch.policy
      if hasattr(policy, "backlog_contexts"):   # the contexts the waiting will decode from
        policy.backlog_contexts = [r.prompt_len + 1 for r, _ in self.transfer_queue]
      plan = self.policies.role_switch.remesh(now, self.tier("prefill"), self.tier("decode"),
                                              len(self.transfer_queue))
      if plan is not None:
        self._start_remesh(plan, now)
    s = self._switch
    if s is not None and s.built_s is None and self._quiescent(s):
      s.phases["drain"] = now - s.start_s
      self._build(s, now)

  def _remesh_ready(self) -> bool:
    """A re-mesh waits only for the next turn to build (its old instances went quiet this
    turn, e.g. when the last KV transfer into them landed after the re-mesh's turn)."""
    s = self._switch
    return s is not None and s.built_s is None and self._quiescent(s)

  def remesh_holds(self, tier: str) -> bool:
    """Whether `tier` has no instance serving because a re-mesh replaces it."""
    return self._switch is not None and self._switch.plan.role == tier and not self.tier(tier)

  def _holds_arrivals(self) -> bool:
    if self._switch is None:
      return False
    if self.remesh_holds("prefill"):
      return True
    return self.remesh_holds("decode") and not isinstance(self.policies.path.policy, AlwaysDisagg)

  def _park(self, r: Request, role: str, fallback: str, why: str) -> bool:
    """A request to recompute on `role` while a re-mesh leaves it empty waits for the new
    instances (True), instead of failing."""
    if not self.remesh_holds(role):
      return False
    self._switch.parked.append((r, fallback, why))
    return True

  def _remesh_wake_s(self) -> float | None:
    due = getattr(self.policies.role_switch, "next_due_s", None)
    return due() if due is not None and self._switch is None else None

  # ---- phases ------------------------------------------------------------------------------

  def _start_remesh(self, plan, now: float) -> None:
    old = [w for w in self.tier(plan.role)]
    if not old:
      return
    dead = [w.name for w in self.workers if w.role == plan.role and w.dead and not w.retired]
    if dead:   # its devices are not all there to re-mesh: the switch is called off
      self.remesh_events.append({
          "t_s": now, "role": plan.role, "from": f"{len(old)}x{old[0].tp}", "to": plan.layout,
          "reason": plan.reason, "drain": self._remesh_drain,
          "instances_from": [w.name for w in old], "ok": False,
          "error": f"the {plan.role} tier has dead instances: {', '.join(dead)}",
          "phases_s": {}, "total_s": 0.0, "migrated": 0, "requeued": 0, "recomputed": 0})
      return
    devices = sum(w.tp for w in old)
    if plan.count * plan.tp != devices:
      raise ValueError(f"re-mesh {plan.role}:{plan.layout} needs {plan.count * plan.tp} "
                       f"devices; the {plan.role} tier has {devices}")
    if len(old) == plan.count and all(w.tp == plan.tp for w in old):
      return   # already that layout
    s = self._switch = _Switch(plan, old, now, self._remesh_drain)
    for w in old:
      w.draining_to = "remesh"
      w.paused = self._remesh_drain == "migrate"
      self._touch(w)
    self._tiers = None

  def _quiescent(self, s: _Switch) -> bool:
    old = {id(w) for w in s.old}
    if any(w.steps_in_flight() for w in s.old):
      return False
    for r, src, dst, *_ in self._pending_transfers:
      if id(src) in old or id(dst) in old:
        return False
    for r, src, dst in self._in_transfer.values():
      if id(src) in old or id(dst) in old:
        return False
    if s.drain == "migrate":
      return True
    return (all(w.drained() and not len(w.tables) for w in s.old)
            and not any(id(src) in old for _, src in self.transfer_queue))

  def _build(self, s: _Switch, now: float) -> None:
    names = [f"{s.plan.role}-m{len(self.remesh_events) + 1}-{i}" for i in range(s.plan.count)]
    try:
      instances, phases = self._remesh_builder.build([w.instance for w in s.old], s.plan.role,
                                                     s.plan.count, s.plan.tp, names)
    except DeviceError as e:   # the old instances serve on
      s.event.update(ok=False, error=f"{type(e).__name__}: {e}", phases_s=dict(s.phases))
      self._end_switch(s, resume_old=True)
      return
    s.phases.update(reshard=phases["reshard_s"], compile=phases["compile_s"])
    max_batch = s.old[0].max_batch
    for inst in instances:
      w = InstanceQueue(inst, s.plan.role, max_batch)
      w.draining_to, w.paused = "remesh", True   # not in the tier until the rejoin
      self._audit(w)
      self._index[id(w)] = len(self.workers)
      self.workers.append(w)
      self._by_name[w.name] = w
      s.new.append(w)
      if all(inst is not i for i in self.instances_used):
        self.instances_used.append(inst)
    virtual = hasattr(self.clock, "advance_to")
    s.phases["migrate"] = self._migrate(s, virtual)
    s.built_s = now
    ready = now + (s.phases["reshard"] + s.phases["compile"] + s.phases["migrate"]
                   if virtual else 0.0)
    self._schedule(max(ready, self.clock.now()), "remesh", s)

  def _migrate(self, s: _Switch, virtual: bool) -> float:
    """Moves what the old instances hold to the new ones; returns the phase's seconds."""
    start = self.clock.now()
    ends = []
    slots = {id(w): w.max_batch for w in s.new}   # running slots left on each new instance
    for old in s.old:
      for r in list(old.running):
        old.running.remove(r)
        dst = self._move_kv(s, r, old, ends, slots)
        if dst is None:
          continue
        if slots[id(dst)] > 0:
          slots[id(dst)] -= 1
          dst.running.append(r)
          r.decode_instance = dst.name
        else:   # more running than the new layout's slots (a merge of full instances): its
          r.status = Status.TRANSFERRING    # KV waits on dst for a slot, first in the queue
          s.queued.append((r, dst))
      for r in list(old.waiting):
        old.forget(r)
        dst = max(s.new, key=lambda w: (-w.num_running() - w.num_waiting(), w.free_pages()))
        if r.id in old.tables:             # partly prefilled: starts over (its decode slot
          old.tables.free(r.id, start)     # is reserved again when it is admitted there)
          r.num_computed_tokens = 0
        dst.waiting.append(r)
        s.requeued += 1
      old.reserved.clear()
    queue = []
    for r, src in self.transfer_queue:     # prefilled, waiting for a decode instance: back
      if src in s.old:                     # in the queue at the rejoin, its KV landed
        dst = self._move_kv(s, r, src, ends)
        if dst is not None:                # (else it recomputes on dst)
          s.queued.append((r, dst))
      else:
        queue.append((r, src))
    self.transfer_queue = type(self.transfer_queue)(queue)
    if virtual:
      return max(ends, default=start) - start
    return self.clock.now() - start

  def _move_kv(self, s: _Switch, r: Request, src: InstanceQueue, ends: list,
               slots: dict | None = None):
    """r's KV from src to the new instance with the most free pages (with `slots`, of those
    with a running slot left first); that instance, or None when r was sent to recompute on
    one (no pool could hold it, or the transfer failed)."""
    now = self.clock.now()
    tokens = src.tables.tokens_of(r.id)
    dst = max(s.new, key=lambda w: ((slots or {}).get(id(w), 0) > 0, w.free_pages()))
    src_pages = src.tables.block_table(r.id)
    why, lands_later = None, False
    if not dst.tables.can_allocate(tokens):
      why = "no new instance's pool can hold its KV"
    else:
      dst_pages = dst.tables.allocate(r.id, tokens, owner=r.tenant)
      try:
        result = self.transfer_fn(src.instance, src_pages, dst.instance, dst_pages)
        if hasattr(result, "ready"):
          if getattr(result, "end_s", None) is not None:   # virtual: lands by the rejoin
            ends.append(result.end_s)
            s.landing.append((r, src, result))
            lands_later = True
          else:
            result = result.result()
      except DeviceError as e:
        why = self._device_failure(e)
        dst.tables.free(r.id, now)
    if why is None:
      s.migrated += 1
      if not lands_later:                  # (else its source pages go at the rejoin)
        src.tables.free(r.id, now)
      return dst
    src.tables.free(r.id, now)
    s.recomputed += 1
    r.num_computed_tokens, r.status = 0, Status.WAITING
    fallback = "remesh:recomputed"
    self.tally.fallback(fallback, r.fallbacks)
    r.fallbacks.append(fallback)
    dst.waiting.append(r)
    return None

  def _rejoin(self, s: _Switch) -> None:
    """The new instances join the tier, the old ones are released (a `remesh` event)."""
    if self._switch is not s:
      return
    now = self.clock.now()
    if s.built_s is not None:
      s.phases["rejoin_wait"] = max(0.0, now - s.built_s - s.phases["reshard"]
                                    - s.phases["compile"] - s.phases["migrate"])
    for r, src, pending in s.landing:      # (due by now: the contents are copied, the
      pending.result()                     # source pages freed)
      if r.id in src.tables:               # (unless r was cancelled meanwhile)
        src.tables.free(r.id, now)
    self._remesh_builder.release([w.instance for w in s.old])
    for w in s.old:
      w.dead, w.retired, w.paused, w.draining_to = True, True, False, None
      w.instance = _Retired(w.instance)
    for w in s.new:
      w.paused, w.draining_to = False, None
      self._touch(w)
    queued = [(r, w) for r, w in s.queued if not r.status.terminal and r.id in w.tables]
    self._kv_on_decode.update(id(r) for r, _ in queued)
    self.transfer_queue.extendleft(reversed(queued))
    s.event.update(ok=True, instances_to=[w.name for w in s.new],
                   phases_s=dict(s.phases))
    self._end_switch(s, resume_old=False)

  def _end_switch(self, s: _Switch, resume_old: bool) -> None:
    now = self.clock.now()
    for key, since in self._held_since.items():   # KV held through the switch: no decode
      self._held_since[key] = max(since, now)     # instance could pull it, its lease restarts
    if resume_old:
      for w in s.old:
        w.paused, w.draining_to = False, None
        self._touch(w)
    s.event.update(total_s=now - s.start_s, migrated=s.migrated,
                   requeued=s.requeued, recomputed=s.recomputed)
    self.remesh_events.append(s.event)
    self._switch, self._tiers = None, None
    for r, fallback, why in s.parked:
      self._recompute_on(r, s.plan.role, fallback, why)

  def _finish_remesh_at_end(self) -> None:
    """The run ended with a re-mesh under way: a built one rejoins now, one still draining is
    called off (the old instances stay)."""
    s = self._switch
    if s is None:
      return
    if s.built_s is not None:
      self._rejoin(s)
      return
    s.event.update(ok=False, error="the run ended before the old instances drained",
                   phases_s=dict(s.phases))
    self._end_switch(s, resume_old=True)
