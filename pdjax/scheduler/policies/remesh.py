"""remesh: change a tier's instance count and TP live (the driver's mechanism:
pdjax/scheduler/remesh.py). Either scripted (`scheduler.remesh_schedule`, for experiments and
tests: "decode:1x2@1.5,decode:2x1@4" = at 1.5 s the decode tier becomes 1 instance at TP2, at
4 s 2 instances at TP1) or decided from the load, every `interval_s` once `cooldown_s` has
passed since the last re-mesh began:

  decode tier   merge (half the instances, twice the TP: faster steps, fewer slots) when the
                measured token interval of its instances exceeds 0.9 x the TPOT SLO while its
                running sequences fit in half the slots; split (twice the instances at half
                the TP) when prefilled requests wait for a slot (transfer backlog, every
                instance's batch full) and the token interval is under half the SLO.
  prefill tier  merge when the queued prompts average `length_threshold` tokens or more
                (long documents: a wider instance prefills each faster, TTFT); split when more
                prompts wait than instances and they average under it (many short chats).

When the builder knows every layout's step costs (the simulator; the engine with
`scheduler.latency_profile`), the decision is predicted instead (policies/remesh_costs.py):
switch to a layout predicted to drain the queued prompts faster by more than the switch
costs, or to serve the decode tier's sequences (the running ones and those waiting for a slot,
at their own contexts) within the TPOT SLO when the current one does not; when no layout
serves them all, to the one decoding the most of them per second within the SLO if that pays
for the switch over the cooldown. A layout must cover the tier's devices (count x TP
constant) with a TP in `allowed_tps`; a tier is never left empty (count >= 1). Pure Python."""

from __future__ import annotations

import dataclasses
import re

from pdjax.scheduler.policies import remesh_costs
from pdjax.scheduler.policies.base import RoleSwitchPolicy

_ENTRY = re.compile(r"^(prefill|decode):(\d+)x(\d+)@([0-9]*\.?[0-9]+)$")


@dataclasses.dataclass(frozen=True)
class RemeshPlan:
  role: str          # "prefill" | "decode"
  count: int         # instances after the re-mesh
  tp: int            # their TP
  reason: str        # "scheduled" | what the load showed

  @property
  def layout(self) -> str:
    return f"{self.count}x{self.tp}"


def parse_schedule(text: str) -> list[tuple[float, str, int, int]]:
  """(seconds, role, count, tp) per entry of a `scheduler.remesh_schedule` string, in time
  order; ValueError with a one-line reason for a malformed entry."""
  out = []
  for entry in (e.strip() for e in text.split(",") if e.strip()):
    m = _ENTRY.match(entry)
    if not m:
      raise ValueError(f"scheduler.remesh_schedule entry {entry!r} is not "
                       "'<prefill|decode>:<instances>x<tp>@<seconds>' (e.g. 'decode:1x2@1.5')")
    role, count, tp, t = m.group(1), int(m.group(2)), int(m.group(3)), float(m.group(4))
    if count < 1 or tp < 1:
      raise ValueError(f"scheduler.remesh_schedule entry {entry!r}: instances and tp must be "
                       ">= 1")
    out.append((t, role, count, tp))
  return sorted(out, key=lambda e: e[0])


def schedule_error(text: str, devices: dict[str, int], allowed_tps: tuple[int, ...]) -> str | None:
  """One-line reason a schedule does not fit the tiers (devices: role -> the tier's devices),
  else None."""
  try:
    entries = parse_schedule(text)
  except ValueError as e:
    return str(e)
  for _, role, count, tp in entries:
    if count * tp != devices[role]:
      return (f"scheduler.remesh_schedule entry '{role}:{count}x{tp}' needs {count * tp} "
              f"devices; the {role} tier has {devices[role]}")
    if tp not in allowed_tps:
      return (f"scheduler.remesh_schedule entry '{role}:{count}x{tp}': tp {tp} is not one the "
              f"model allows ({list(allowed_tps)})")
  return None


class Remesh(RoleSwitchPolicy):

  def __init__(self, remesh_schedule: str = "", interval_s: float = 1.0,
               remesh_cooldown_s: float = 5.0, slo_tpot_s: float = 0.1,
               length_threshold: int = 1024, allowed_tps: tuple[int, ...] = (1, 2, 4, 8), **_):
    self.schedule = parse_schedule(remesh_schedule) if remesh_schedule else []
    self.interval_s, self.cooldown_s = interval_s, remesh_cooldown_s
    self.slo_tpot_s, self.length_threshold = slo_tpot_s, length_threshold
    self.allowed_tps = tuple(allowed_tps)
    self._next = 0                       # the next schedule entry
    self._last_check = float("-inf")
    self._last_remesh = float("-inf")
    self.cost_of = None    # (role, tp) -> a step-cost model; set by the driver from the
    self.switch_s = 0.0    # builder, with a switch's expected seconds (remesh_costs.py)
    self.backlog_contexts = None   # set by the driver before each call: the context each
    #                                prefilled request waiting for a decode slot starts with

  def remesh(self, now: float, prefill_tier: list, decode_tier: list,
             transfer_backlog: int) -> RemeshPlan | None:
    """The re-mesh to start now, if any (the driver runs one at a time and asks again once it
    is done)."""
    backlog_contexts = self.backlog_contexts
    if self.schedule:
      if self._next < len(self.schedule) and self.schedule[self._next][0] <= now:
        _, role, count, tp = self.schedule[self._next]
        self._next += 1
        return RemeshPlan(role, count, tp, "scheduled")
      return None
    if now - self._last_check < self.interval_s or now - self._last_remesh < self.cooldown_s:
      return None
    self._last_check = now
    if self.cost_of is not None:
      plan = self._planned_by_costs(prefill_tier, decode_tier,
                                    transfer_backlog if backlog_contexts is None
                                    else backlog_contexts)
    else:
      plan = (self._decode_plan(decode_tier, transfer_backlog)
              or self._prefill_plan(prefill_tier))
    if plan is not None:
      self._last_remesh = now
    return plan

  def next_due_s(self) -> float | None:
    """When the next scheduled re-mesh is due (the driver wakes for it), or None."""
    return self.schedule[self._next][0] if self._next < len(self.schedule) else None

  def _layout(self, tier: list, factor: float) -> tuple[int, int] | None:
    """(count, tp) with TP scaled by `factor` over the same devices, if allowed."""
    if not tier or len({w.tp for w in tier}) != 1:
      return None
    devices, tp = sum(w.tp for w in tier), int(tier[0].tp * factor)
    if tp < 1 or tp not in self.allowed_tps or devices % tp or tp == tier[0].tp:
      return None
    return devices // tp, tp

  def _layouts(self, tier: list) -> list[tuple[int, int]]:
    devices = sum(w.tp for w in tier)
    return [(devices // tp, tp) for tp in self.allowed_tps if devices % tp == 0]

  def _planned_by_costs(self, prefill_tier: list, decode_tier: list,
                        backlog) -> RemeshPlan | None:
    for role, tier in (("decode", decode_tier), ("prefill", prefill_tier)):
      if not tier or len({w.tp for w in tier}) != 1:
        continue
      if role == "decode":
        found = remesh_costs.decode_layout(tier, self._layouts(tier), self.cost_of,
                                           self.slo_tpot_s, backlog, switch_s=self.switch_s,
                                           horizon_s=self.cooldown_s)
      else:
        found = remesh_costs.prefill_layout(tier, self._layouts(tier), self.cost_of,
                                            self.switch_s)
      if found is not None:
        return RemeshPlan(role, found[0], found[1], found[2])
    return None

  def _decode_plan(self, tier: list, backlog: int) -> RemeshPlan | None:
    intervals = [w.token_interval_s for w in tier if w.token_interval_s is not None]
    if not intervals:
      return None
    interval = max(intervals)
    running = sum(w.num_running() for w in tier)
    merged = self._layout(tier, 2)
    if (merged and interval > 0.9 * self.slo_tpot_s
        and running <= merged[0] * tier[0].max_batch):
      return RemeshPlan("decode", *merged, f"token interval {interval * 1e3:.1f} ms > 0.9 x "
                        f"TPOT SLO; {running} running fit {merged[0]} instance(s)")
    split = self._layout(tier, 0.5)
    if (split and backlog > 0 and all(w.num_running() >= w.max_batch for w in tier)
        and interval < 0.5 * self.slo_tpot_s):
      return RemeshPlan("decode", *split, f"{backlog} waiting for a slot, token interval "
                        f"{interval * 1e3:.1f} ms < 0.5 x TPOT SLO")
    return None

  def _prefill_plan(self, tier: list) -> RemeshPlan | None:
    waiting = sum(w.num_waiting() for w in tier)
    if not waiting:
      return None
    mean = sum(w.queued_tokens() for w in tier) / waiting
    merged = self._layout(tier, 2)
    if merged and mean >= self.length_threshold:
      return RemeshPlan("prefill", *merged, f"queued prompts average {mean:.0f} tokens")
    split = self._layout(tier, 0.5)
    if split and mean < self.length_threshold and waiting > len(tier):
      return RemeshPlan("prefill", *split, f"{waiting} short prompts (mean {mean:.0f} tokens) "
                        f"queued on {len(tier)} instance(s)")
    return None
