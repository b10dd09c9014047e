"""length_hybrid: prompts shorter than `length_threshold` tokens skip the prefill tier and are
prefilled and decoded on a decode instance (no KV transfer); longer prompts go disaggregated.
The seed's advice: short, low-reuse requests should not pay for the complex path."""

from pdjax.scheduler.policies.always_disagg import DISAGG
from pdjax.scheduler.policies.base import PathChoice, PathPolicy


class LengthHybrid(PathPolicy):

  def __init__(self, length_threshold: int = 128, **_):
    self.threshold = length_threshold

  def choose(self, req, prefill_tier, decode_tier):
    if req.prompt_len < self.threshold:
      return PathChoice("colocated", "decode")
    return DISAGG
