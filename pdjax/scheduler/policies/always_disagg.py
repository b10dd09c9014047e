"""always_disagg: every request is prefilled on the prefill tier and decoded on the decode tier."""

from pdjax.scheduler.policies.base import PathChoice, PathPolicy

DISAGG = PathChoice("disaggregated", "prefill")


class AlwaysDisagg(PathPolicy):

  def __init__(self, **_):
    pass

  def choose(self, req, prefill_tier, decode_tier):
    return DISAGG
