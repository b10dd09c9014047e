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

With `latency_feedback` (a window of requests) each TTFT prediction adds what the predictions
of the last requests on that path and prompt size missed (`latency_feedback.py`), learned when
their first token arrives; a candidate's `feedback` in `path_reason` holds the correction
added to its ttft_s and the size class.

Every request's `path_reason` holds both predictions, the headrooms and why.
"""

import dataclasses

from pdjax.scheduler.policies.always_disagg import DISAGG
from pdjax.scheduler.policies.base import PathChoice, PathPolicy
from pdjax.scheduler.policies.latency_feedback import LatencyFeedback, size_class
from pdjax.scheduler.policies.latency_model import (headroom, predict_local, predict_remote,
                                                    uncached_tokens)

LOCAL = PathChoice("colocated", "decode")
CANDIDATE = {"disaggregated": "remote", "colocated": "local"}   # path -> its prediction


class SloHeadroom(PathPolicy):

  uses_picks = True

  def __init__(self, slo_ttft_s: float = 1.0, slo_tpot_s: float = 0.1, token_budget: int = 512,
               shared_salt: str = "", chunk_budget: int = 128, local_prefill: str = "whole",
               latency_feedback: int = 0, **_):
    self.slo, self.budget, self.shared_salt = (slo_ttft_s, slo_tpot_s), token_budget, shared_salt
    # a local prompt's steps: chunk_budget tokens when chunked into the decode batch
    self.local_budget = chunk_budget if local_prefill == "chunked" else token_budget
    self.feedback = LatencyFeedback(latency_feedback) if latency_feedback else None

  def choose(self, req, prefill_tier, decode_tier, picks=None):
    pw, dw = picks or (None, None)
    if pw is None or dw is None:
      reason = {"policy": "slo_headroom", "why": "no instance to pick in a tier"}
      choice = LOCAL if pw is None and dw is not None else DISAGG
      return PathChoice(choice.path, choice.tier, dict(reason, choice=choice.path))
    host = [*prefill_tier, *decode_tier]
    remote = predict_remote(req, pw, dw, self.slo, self.budget, self.shared_salt, host)
    local = predict_local(req, dw, prefill_tier, self.slo, self.local_budget, self.shared_salt,
                          host)
    if self.feedback is not None:
      remote = remote and self._corrected(remote, "remote", pw, req)
      local = local and self._corrected(local, "local", dw, req)
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

  def _corrected(self, p, name: str, worker, req):
    """p with the feedback's TTFT correction for its path and the prompt's size class there."""
    size = size_class(uncached_tokens(worker, req, self.shared_salt))
    ttft = max(p.ttft_s + self.feedback.correction_s(name, size), 0.0)
    worst = p.tpot_s if p.batch_tpot_s is None else max(p.tpot_s, p.batch_tpot_s)
    return dataclasses.replace(p, ttft_s=ttft, headroom=headroom(ttft, worst, *self.slo),
                               feedback={"size_class": size, "ttft_s": ttft - p.ttft_s})

  def observe_first_token(self, req) -> None:
    """The residual of req's TTFT prediction for the path it took, unless a recovery (a
    fallback, a preemption) put time into what it measured that no prediction counts."""
    if self.feedback is None or req.fallbacks or req.preemptions:
      return
    name = CANDIDATE.get(req.path)
    predicted = (req.path_reason or {}).get(name)
    if not isinstance(predicted, dict) or "feedback" not in predicted:
      return                                   # (taken unpredicted: "unmeasured")
    fb = predicted["feedback"]
    self.feedback.learn(name, fb["size_class"], req.ttft_s - (predicted["ttft_s"] - fb["ttft_s"]))
