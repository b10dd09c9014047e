"""always_colocated: in disaggregated mode, every request is served start to finish by one
prefill-tier instance (a control: the same chips and tiers, no KV transfer)."""

from pdjax.scheduler.policies.base import PathChoice, PathPolicy


class AlwaysColocated(PathPolicy):

  def __init__(self, **_):
    pass

  def choose(self, req, prefill_tier, decode_tier):
    return PathChoice("colocated", "prefill")
