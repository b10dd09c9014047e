"""taichi: TaiChi's latency shifting over instances that both prefill and decode (mode=hybrid).

Every instance runs chunked prefill beside its decodes: P-heavy instances (the prefill tier)
with large chunks, D-heavy ones (the decode tier) with small ones. For the routers' picks (a
P-heavy and a D-heavy instance) the latency model `slo_headroom` uses (`latency_model`)
predicts three candidates from the live state, each prompt in steps of its instance's chunk
budget (`tier_budgets`):

  local    prefill on the P-heavy pick and decode there (no transfer)
  remote   prefill on the P-heavy pick, KV to the D-heavy pick, decode there
  d_local  prefill on the D-heavy pick and decode there

A step there carries up to max_prefill_seqs - 1 of the instance's running decodes beside the
prompt chunk (hybrid_chunked), so each predicted step pays their decode step and gives them a
token of its budget (`mixed_rows`).

A request whose TTFT is at risk (local's predicted TTFT over 0.9 x the TTFT SLO) goes where
its first token comes soonest: d_local when it beats the P-heavy pick. One whose TPOT is at
risk (local's TPOT, or the worst TPOT of the batch its prefill joins, over 0.9 x the TPOT SLO)
decodes where steps are shortest: remote when its TPOT beats local's. Otherwise it runs
wholly on the pick with more SLO headroom: d_local when its headroom beats local's (so the
D-heavy chips serve too: with every such request kept local, a 1P + 1D split of Llama-3-70B
on sharegpt sustained half chunked 2xTP4's rate), else local; while local cannot be predicted
(rates not measured yet), local. Each request's `path_reason` holds the three predictions,
the two risks and why.
"""

from pdjax.scheduler.policies.base import PathChoice, PathPolicy
from pdjax.scheduler.policies.latency_model import predict_local, predict_remote

LOCAL = PathChoice("colocated", "prefill")        # P-heavy prefills and decodes
REMOTE = PathChoice("disaggregated", "prefill")   # P-heavy prefills, D-heavy decodes
D_LOCAL = PathChoice("colocated", "decode")       # D-heavy prefills and decodes
MARGIN = 0.9                                      # at risk: predicted over MARGIN x SLO


def _worst_tpot(p) -> float:
  return p.tpot_s if p.batch_tpot_s is None else max(p.tpot_s, p.batch_tpot_s)


class TaiChi(PathPolicy):
  """Hybrid instances: a request at TTFT risk starts soonest, at TPOT risk decodes on the
  shortest steps, else runs where the SLO headroom is larger."""

  uses_picks = True

  def __init__(self, slo_ttft_s: float = 1.0, slo_tpot_s: float = 0.1, token_budget: int = 512,
               shared_salt: str = "", tier_budgets: dict | None = None,
               max_prefill_seqs: int = 17, **_):
    self.slo, self.shared_salt = (slo_ttft_s, slo_tpot_s), shared_salt
    self.rows = max(max_prefill_seqs - 1, 0)   # decodes a chunked step carries (hybrid_chunked)
    budgets = tier_budgets or {}
    self.p_budget = budgets.get("prefill", token_budget)   # tokens per prompt step, per tier
    self.d_budget = budgets.get("decode", token_budget)

  def choose(self, req, prefill_tier, decode_tier, picks=None):
    pw, dw = picks or (None, None)
    if pw is None or dw is None:
      choice = D_LOCAL if pw is None else LOCAL
      return PathChoice(choice.path, choice.tier, {
          "policy": "taichi", "choice": choice.path, "tier": choice.tier,
          "why": "no instance to pick in a tier"})
    host = [*prefill_tier, *decode_tier]
    local = predict_local(req, pw, prefill_tier, self.slo, self.p_budget, self.shared_salt,
                          host, self.rows)
    remote = predict_remote(req, pw, dw, self.slo, self.p_budget, self.shared_salt, host,
                            self.rows)
    d_local = predict_local(req, dw, prefill_tier, self.slo, self.d_budget, self.shared_salt,
                            host, self.rows)
    ttft_risk = local is not None and local.ttft_s > MARGIN * self.slo[0]
    tpot_risk = local is not None and _worst_tpot(local) > MARGIN * self.slo[1]
    choice, why = LOCAL, "within the SLOs: local"
    if local is None:
      why = "unmeasured: local"
    elif (not ttft_risk and not tpot_risk and d_local is not None
          and d_local.headroom > local.headroom):
      choice, why = D_LOCAL, "within the SLOs: more headroom on the d_heavy pick"
    elif ttft_risk and d_local is not None and d_local.ttft_s < local.ttft_s:
      choice, why = D_LOCAL, "ttft at risk: first token soonest on the d_heavy pick"
    elif tpot_risk and remote is not None and remote.tpot_s < _worst_tpot(local):
      choice, why = REMOTE, "tpot at risk: shortest steps on the d_heavy pick"
    elif ttft_risk or tpot_risk:
      why = "at risk, but the p_heavy pick is the best: local"
    return PathChoice(choice.path, choice.tier, {
        "policy": "taichi", "choice": choice.path, "tier": choice.tier, "why": why,
        "ttft_at_risk": ttft_risk, "tpot_at_risk": tpot_risk,
        "p_heavy": pw.name, "d_heavy": dw.name,
        "local": local and local.to_json(), "remote": remote and remote.to_json(),
        "d_local": d_local and d_local.to_json()})
