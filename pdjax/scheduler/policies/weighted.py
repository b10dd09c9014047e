"""weighted: the instance with the highest weighted sum of scorer values (llm-d's inference
scheduler's shape: filters, weighted scorers, a max-score picker). The scorers and weights are
scheduler.prefill_scorers for the prefill router and scheduler.decode_scorers for the decode
router ("queue=2,prefix=3"; policies/scorers.py lists the built-in scorers); each scorer's
values are normalised over the candidates, ties rotate (seeded: policies/ties.py)."""

from pdjax.scheduler.policies import scorers as scorers_lib
from pdjax.scheduler.policies.base import Router
from pdjax.scheduler.policies.ties import RotatingTies


class Weighted(Router):

  def __init__(self, seed: int = 0, tier: str = "prefill",
               prefill_scorers: str = "queue=2,prefix=3", decode_scorers: str = "queue=2,prefix=3",
               shared_salt: str = "", policy_args: dict | None = None, **_):
    key = f"scheduler.{tier}_scorers"
    spec = prefill_scorers if tier == "prefill" else decode_scorers
    self.scorers = [(scorers_lib.make(name, key, shared_salt, seed, policy_args), weight)
                    for name, weight in scorers_lib.parse(spec, key)]
    self._ties = RotatingTies(seed)

  def totals(self, req, candidates) -> list[float]:
    """Each candidate's weighted sum of normalised scores."""
    totals = [0.0] * len(candidates)
    for scorer, weight in self.scorers:
      values = [scorer.raw(req, w) for w in candidates]
      low, high = min(values), max(values)
      if high == low:
        continue
      for i, v in enumerate(values):
        share = (v - low) / (high - low)
        totals[i] += weight * (share if scorer.higher_is_better else 1.0 - share)
    return totals

  def choose(self, req, candidates):
    if not candidates:
      return None
    totals = dict(zip(map(id, candidates), self.totals(req, candidates)))
    pick = self._ties.best(candidates, lambda w: -totals[id(w)])
    for scorer, _ in self.scorers:
      scorer.chosen(req, pick)
    return pick
