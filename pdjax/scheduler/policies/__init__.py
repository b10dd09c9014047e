"""Scheduling policies, one file each, chosen by name in the config (`scheduler.*`).

Pure Python: the real driver and the simulator run the same objects. `base` holds the
interfaces (Router, PathPolicy, AdmissionPolicy, StepPolicy, RoleSwitchPolicy) and StepPlan;
`build()` here makes a run's `Policies` from the config's names (the tables below), `ties` the
routers' tie-breaking.
"""

from __future__ import annotations

import dataclasses

from pdjax.scheduler.policies.always_colocated import AlwaysColocated
from pdjax.scheduler.policies.always_disagg import AlwaysDisagg
from pdjax.scheduler.policies.base import (AdmissionPolicy, PathChoice, PathPolicy,
                                           RoleSwitchPolicy, Router, StepPlan, StepPolicy)
from pdjax.scheduler.policies.chunked_prefill import ChunkedPrefill
from pdjax.scheduler.policies.isl_bounding import IslBounding
from pdjax.scheduler.policies.kv_aware import KvAware
from pdjax.scheduler.policies.kv_aware_prefix import KvAwarePrefix
from pdjax.scheduler.policies.least_loaded import LeastLoaded
from pdjax.scheduler.policies.length_hybrid import LengthHybrid
from pdjax.scheduler.policies.load_hybrid import LoadHybrid
from pdjax.scheduler.policies.no_admission import NoAdmission
from pdjax.scheduler.policies.no_role_switch import NoRoleSwitch
from pdjax.scheduler.policies.power_of_two import PowerOfTwo
from pdjax.scheduler.policies.predicted_slo import PredictedSlo
from pdjax.scheduler.policies.prefill_first import PrefillFirst
from pdjax.scheduler.policies.prefix_hybrid import PrefixHybrid
from pdjax.scheduler.policies.queue_bound import QueueBound
from pdjax.scheduler.policies.queue_balance import QueueBalance
from pdjax.scheduler.policies.random_router import RandomRouter
from pdjax.scheduler.policies.remesh import Remesh
from pdjax.scheduler.policies.round_robin import RoundRobin
from pdjax.scheduler.policies.session_sticky import SessionSticky
from pdjax.scheduler.policies.slo_headroom import SloHeadroom
from pdjax.scheduler.policies.taichi import TaiChi
from pdjax.scheduler.policies.weighted import Weighted

ROUTERS = {"round_robin": RoundRobin, "random": RandomRouter, "least_loaded": LeastLoaded,
           "power_of_two": PowerOfTwo, "kv_aware": KvAware, "kv_aware_prefix": KvAwarePrefix,
           "session_sticky": SessionSticky, "weighted": Weighted}
PATHS = {"always_disagg": AlwaysDisagg, "always_colocated": AlwaysColocated,
         "length_hybrid": LengthHybrid, "load_hybrid": LoadHybrid, "prefix_hybrid": PrefixHybrid,
         "isl_bounding": IslBounding, "slo_headroom": SloHeadroom, "taichi": TaiChi}
ADMISSIONS = {"none": NoAdmission, "queue_bound": QueueBound, "predicted_slo": PredictedSlo}
COLOCATED = {"prefill_first": PrefillFirst, "chunked_prefill": ChunkedPrefill}
ROLE_SWITCH = {"none": NoRoleSwitch, "queue_balance": QueueBalance, "remesh": Remesh}
CHOICES = {"prefill_router": ROUTERS, "decode_router": ROUTERS, "path": PATHS,
           "admission": ADMISSIONS, "colocated_policy": COLOCATED, "role_switch": ROLE_SWITCH}


@dataclasses.dataclass
class Policies:
  prefill_router: Router
  decode_router: Router
  path: PathPolicy
  admission: AdmissionPolicy
  step: StepPolicy
  role_switch: RoleSwitchPolicy


def unknown_policy(key: str, name: str) -> str | None:
  """One-line error for a name `scheduler.<key>` cannot use (a built-in name, an installed
  one, or a module:Attr import path: policies/registry.py), else None. Imports the user's
  module, so a bad one fails here, before anything compiles."""
  from pdjax.scheduler.policies import registry
  try:
    registry.policy_class(key, name, CHOICES[key])
  except registry.PolicyError as e:
    return str(e)
  return None


def build(names: dict, params: dict, seed: int = 0, policy_args: dict | None = None) -> Policies:
  """names: {"prefill_router": ..., ...}, each a built-in name, an installed name or a
  module:Attr path; params: keyword arguments every policy may use (token_budget,
  chunk_budget, max_prefill_seqs, length_threshold, isl_ratio, saturation, max_queue,
  slo_ttft_s, slo_tpot_s, interval_s, queued_tokens, remesh_schedule, remesh_cooldown_s,
  allowed_tps); each built-in takes what it needs. A user's class gets those of them its
  __init__ accepts, plus `policy_args` (scheduler.policy_args) it accepts."""
  from pdjax.scheduler.policies import registry
  policy_args = dict(policy_args or {})
  def make(key, salt=0):
    name = names[key]
    cls = registry.policy_class(key, name, CHOICES[key])
    kwargs = dict(params, policy_args=policy_args)
    if key.endswith("_router"):   # which tier it routes for (weighted reads its scorers)
      kwargs["tier"] = key.removesuffix("_router")
    if name in CHOICES[key]:
      return cls(seed=seed + salt, **kwargs)
    del kwargs["policy_args"]
    return registry.construct(cls, kwargs, policy_args, seed + salt, f"scheduler.{key}={name!r}")
  return Policies(prefill_router=make("prefill_router"), decode_router=make("decode_router", 1),
                  path=make("path"), admission=make("admission"),
                  step=make("colocated_policy"), role_switch=make("role_switch"))
