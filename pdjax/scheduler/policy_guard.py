"""The driver's side of the policy API (scheduler/policy_api.py): every policy is called through
a guard that hands it read-only views, takes its answer back to the driver's own objects, and
checks the answer is one the driver can use.

A router must choose one of its candidates; a path policy must return a PathChoice with a known
path and tier; an admission policy None or a reason string; a step policy a StepPlan of the
requests it was shown; a role switch (worker, role) pairs of its tiers. Anything else raises
PolicyAnswerError naming the key and the policy: it is the policy's bug, not a state the
driver can recover from. The guard forwards every other attribute read to the policy (e.g.
`uses_picks`, `decodes_follow_running`, `next_due_s`); `guard.policy` is the policy itself.
"""

from __future__ import annotations

import dataclasses

from pdjax.scheduler.policies.base import PathChoice, StepPlan
from pdjax.scheduler.policy_api import InstanceView, RequestView, Views

CHOICES = (("disaggregated", "prefill"), ("colocated", "prefill"), ("colocated", "decode"))
ROLES = ("prefill", "decode")


class PolicyAnswerError(RuntimeError):
  """A policy returned something the driver cannot use (a bug in the policy)."""


def _name(policy) -> str:
  cls = type(policy)
  return f"{cls.__module__}:{cls.__qualname__}"


class _Guard:
  key = ""

  def __init__(self, policy, views: Views):
    self.policy, self.views = policy, views

  def __getattr__(self, name):   # (only for names the guard itself lacks)
    if name in ("policy", "views"):
      raise AttributeError(name)
    return getattr(self.policy, name)

  def _bad(self, what: str) -> PolicyAnswerError:
    return PolicyAnswerError(f"scheduler.{self.key} ({_name(self.policy)}) {what}")

  def _queue(self, view, queues, views) -> object:
    for q, v in zip(queues, views):
      if view is v:
        return q
    what = repr(view) if isinstance(view, InstanceView) else f"an object of type {type(view).__name__}"
    raise self._bad(f"answered {what}, which is not one of the instances it was shown "
                    f"{[v.name for v in views]}")


class GuardedRouter(_Guard):

  def __init__(self, policy, views: Views, key: str):
    super().__init__(policy, views)
    self.key = key

  def choose(self, req, candidates):
    shown = self.views.instances(candidates)
    pick = self.policy.choose(self.views.request(req), shown)
    if pick is None and not candidates:
      return None
    if pick is None:
      raise self._bad(f"chose None among {len(candidates)} candidates "
                      f"{[v.name for v in shown]} (None only when there are none)")
    return self._queue(pick, candidates, shown)


class GuardedPath(_Guard):
  key = "path"

  @property
  def uses_picks(self) -> bool:
    return bool(getattr(self.policy, "uses_picks", False))

  def choose(self, req, prefill_tier, decode_tier, picks=None):
    v = self.views
    args = (v.request(req), v.instances(prefill_tier), v.instances(decode_tier))
    if self.uses_picks:
      choice = self.policy.choose(*args, tuple(None if w is None else v.instance(w)
                                               for w in (picks or (None, None))))
    else:
      choice = self.policy.choose(*args)
    if not isinstance(choice, PathChoice) or (choice.path, choice.tier) not in CHOICES:
      raise self._bad(f"returned {choice!r}: a PathChoice of (path, tier) in "
                      f"{[f'{p}/{t}' for p, t in CHOICES]} is expected")
    return choice

  def observe_first_token(self, req) -> None:
    observe = getattr(self.policy, "observe_first_token", None)   # optional (user's)
    if observe is not None:
      observe(self.views.request(req))


class GuardedAdmission(_Guard):
  key = "admission"

  def check(self, req, worker, path, decode_tier):
    v = self.views
    why = self.policy.check(v.request(req), v.instance(worker), path, v.instances(decode_tier))
    if why is not None and not isinstance(why, str):
      raise self._bad(f"returned {why!r}: None (admit) or a one-line reason is expected")
    return why


class GuardedStep(_Guard):
  key = "colocated_policy"

  def _request(self, rv):
    if not isinstance(rv, RequestView):
      what = f"an object of type {type(rv).__name__}" + (f" ({rv.id!r})" if hasattr(rv, "id") else "")
      raise self._bad(f"planned {what}, which is not a request it was shown")
    return rv._req   # pylint: disable=protected-access

  def plan(self, worker, admit) -> StepPlan:
    def admit_view(rv) -> bool:
      return admit(self._request(rv))
    plan = self.policy.plan(self.views.instance(worker), admit_view)
    if not isinstance(plan, StepPlan):
      raise self._bad(f"returned {plan!r}, not a StepPlan")
    return dataclasses.replace(
        plan, chunks=[(self._request(rv), start, end) for rv, start, end in plan.chunks],
        decodes=[self._request(rv) for rv in plan.decodes])


class GuardedRoleSwitch(_Guard):
  key = "role_switch"

  def decide(self, now, prefill_tier, decode_tier, transfer_backlog):
    v = self.views
    shown_p, shown_d = v.instances(prefill_tier), v.instances(decode_tier)
    out = []
    for pair in self.policy.decide(now, shown_p, shown_d, transfer_backlog) or []:
      view, role = pair
      if role not in ROLES:
        raise self._bad(f"asked for role {role!r}, not one of {list(ROLES)}")
      out.append((self._queue(view, [*prefill_tier, *decode_tier], [*shown_p, *shown_d]),
                  role))
    return out

  def remesh(self, now, prefill_tier, decode_tier, transfer_backlog):
    remesh = getattr(self.policy, "remesh", None)   # optional for a user's role switch
    if remesh is None:
      return None
    v = self.views
    return remesh(now, v.instances(prefill_tier), v.instances(decode_tier), transfer_backlog)


def guard(policies, views: Views):
  """A copy of `policies` (a policies.Policies) with each policy behind its guard (a guarded
  one is re-guarded with these views)."""
  def inner(p):
    return p.policy if isinstance(p, _Guard) else p
  return dataclasses.replace(
      policies,
      prefill_router=GuardedRouter(inner(policies.prefill_router), views, "prefill_router"),
      decode_router=GuardedRouter(inner(policies.decode_router), views, "decode_router"),
      path=GuardedPath(inner(policies.path), views),
      admission=GuardedAdmission(inner(policies.admission), views),
      step=GuardedStep(inner(policies.step), views),
      role_switch=GuardedRoleSwitch(inner(policies.role_switch), views))


__all__ = ["InstanceView", "PolicyAnswerError", "RequestView", "guard"]
