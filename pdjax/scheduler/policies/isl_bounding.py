"""isl_bounding: Dynamo's conditional disaggregation, as a baseline. The effective input length
is the prompt minus the tokens the decode router's chosen instance caches (its prefix cache;
host-tier pages weighted as in `InstanceQueue.prefix_credit`); the request is prefilled
locally on that decode instance when eff_isl < `length_threshold` **and** eff_isl <
`isl_ratio` x the prompt (default 0.7), else disaggregated. No latency model: without prefix
hits every request goes disaggregated."""

from pdjax.scheduler.policies.always_disagg import DISAGG
from pdjax.scheduler.policies.base import PathChoice, PathPolicy
from pdjax.scheduler.policies.latency_model import uncached_tokens


class IslBounding(PathPolicy):

  uses_picks = True

  def __init__(self, length_threshold: int = 128, isl_ratio: float = 0.7,
               shared_salt: str = "", **_):
    self.threshold, self.ratio, self.shared_salt = length_threshold, isl_ratio, shared_salt

  def choose(self, req, prefill_tier, decode_tier, picks=None):
    _, dw = picks or (None, None)
    prompt = req.prefill_len
    if dw is None:
      return PathChoice(DISAGG.path, DISAGG.tier, {
          "policy": "isl_bounding", "choice": DISAGG.path, "why": "no decode instance to pick"})
    eff = uncached_tokens(dw, req, self.shared_salt)
    short, cached = eff < self.threshold, eff < self.ratio * prompt
    choice = PathChoice("colocated", "decode") if short and cached else DISAGG
    why = (f"eff_isl {'<' if short else '>='} length_threshold and "
           f"{'<' if cached else '>='} isl_ratio x prompt")   # (a category: the report counts)
    return PathChoice(choice.path, choice.tier, {
        "policy": "isl_bounding", "choice": choice.path, "decode_instance": dw.name,
        "eff_isl": eff, "prompt": prompt, "why": why})
