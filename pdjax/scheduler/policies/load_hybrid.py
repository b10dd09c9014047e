"""load_hybrid: disaggregated, except when the decode tier is saturated (every decode
instance's running batch at or above `saturation` of its capacity): then the request stays on
a prefill instance for its whole life instead of queueing for decode room."""

from pdjax.scheduler.policies.always_disagg import DISAGG
from pdjax.scheduler.policies.base import PathChoice, PathPolicy


class LoadHybrid(PathPolicy):

  def __init__(self, saturation: float = 0.9, **_):
    self.saturation = saturation

  def choose(self, req, prefill_tier, decode_tier):
    saturated = all(w.num_running() >= self.saturation * w.max_batch
                    or w.free_pages() < w.pages_for(req.max_len) for w in decode_tier)
    return PathChoice("colocated", "prefill") if saturated else DISAGG
