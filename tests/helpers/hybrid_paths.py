"""A path policy for the hybrid tests: the request's id says where it goes (no prediction)."""

from pdjax.scheduler.policies.base import PathChoice


class ById:
  """Tests only: an id starting with 'd' prefills and decodes on a D-heavy instance, 'm'
  prefills on a P-heavy one and moves its KV to a D-heavy one, any other stays on P-heavy."""

  def choose(self, req, prefill_tier, decode_tier, picks=None):
    if req.id.startswith("d"):
      return PathChoice("colocated", "decode", {"policy": "by_id", "choice": "colocated"})
    if req.id.startswith("m"):
      return PathChoice("disaggregated", "prefill", {"policy": "by_id",
                                                     "choice": "disaggregated"})
    return PathChoice("colocated", "prefill", {"policy": "by_id", "choice": "colocated"})
