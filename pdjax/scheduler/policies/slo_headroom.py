"""slo_headroom: each arriving request takes the path with the larger predicted SLO headroom.

For the routers' picks (a prefill instance and a decode instance), the shared latency model
(`latency_model`) predicts TTFT and TPOT of two candidates from the live state: *remote*
(prefill on the prefill pick, KV to the decode pick, decode there) and *local* (prefill on the
decode pick, chunked into its batch, and decode there: no transfer). Each candidate's headroom
is min over TTFT and TPOT of (0.9 x SLO - predicted) / SLO; the larger wins. When neither
meets the SLOs (both headrooms negative) the cheaper one is taken — the fewer device seconds
(remote: the prefill and the transfer; local: the prefill times the decode batch it stalls) —
and `predicted_slo` admission, if on, may then reject it. While a candidate cannot be
predicted (its rates not measured yet) the request goes disaggregated.

Every request's `path_reason` holds both predictions, the headrooms and why.
"""

from pdjax.scheduler.policies.always_disagg import DISAGG
from pdjax.scheduler.policies.base import PathChoice, PathPolicy
from pdjax.scheduler.policies.latency_model import predict_local, predict_remote

LOCAL = PathChoice("colocated", "decode")


class SloHeadroom(PathPolicy):

  uses_picks = True

  def __init__(self, slo_ttft_s: float = 1.0, slo_tpot_s: float = 0.1, token_budget: int = 512,
               shared_salt: str = "", chunk_budget: int = 128, local_prefill: str = "whole",
               **_):
    self.slo, self.budget, self.shared_salt = (slo_ttft_s, slo_tpot_s), token_budget, shared_salt
    # a local prompt's steps: chunk_budget tokens when chunked into the decode batch
    self.local_budget = chunk_budget if local_prefill == "chunked" else token_budget

  def choose(self, req, prefill_tier, decode_tier, picks=None):
    pw, dw = picks or (None, None)
    if pw is None or dw is None:
      reason = {"policy": "slo_headroom", "why": "no instance to pick in a tier"}
      choice = LOCAL if pw is None and dw is not None else DISAGG
      return PathChoice(choice.path, choice.tier, dict(reason, choice=choice.path))
    remote = predict_remote(req, pw, dw, self.slo, self.budget, self.shared_salt)
    local = predict_local(req, dw, prefill_tier, self.slo, self.local_budget, self.shared_salt)
    if remote is None or local is None:
      choice, why = DISAGG, "unmeasured: " + ", ".join(
          name for name, p in (("remote", remote), ("local", local)) if p is None)
    elif max(remote.headroom, local.headroom) >= 0:
      choice = LOCAL if local.headroom > remote.headroom else DISAGG
      why = "larger headroom"
    else:
      choice = LOCAL if local.cost_s < remote.cost_s else DISAGG
      why = "neither meets the SLOs: cheaper"
    return PathChoice(choice.path, choice.tier, {
        "policy": "slo_headroom", "choice": choice.path, "why": why,
        "prefill_instance": pw.name, "decode_instance": dw.name,
        "remote": remote and remote.to_json(), "local": local and local.to_json()})
