"""predicted_slo: reject before prefill when the predicted TTFT or TPOT breaks the SLO
(early rejection, as in Mooncake), instead of wasting prefill on a request that will miss.

TTFT is predicted from the target instance's measured drain rate: (queued prompt tokens ahead
+ this prompt) / prompt tokens it prefilled per second of wall time while requests waited
(which counts the decode steps and stalls between its prefill steps; before a backlog has
been seen, its per-step prefill throughput). TPOT from the decode tier's measured step time
(the least busy instance's). Until an instance has been measured, nothing is rejected for it.
The predictors are `latency_model`'s, the same the slo_headroom path policy uses.
"""

from pdjax.scheduler.policies.base import AdmissionPolicy
from pdjax.scheduler.policies.latency_model import predicted_step_s, predicted_ttft_s


class PredictedSlo(AdmissionPolicy):

  def __init__(self, slo_ttft_s: float = 1.0, slo_tpot_s: float = 0.1, headroom: float = 1.0,
               **_):
    """headroom: admit only what is predicted within headroom x the SLO (a safety margin for
    the prediction's error; scheduler.admission_headroom)."""
    self.ttft, self.tpot = headroom * slo_ttft_s, headroom * slo_tpot_s
    self.limit = "slo.{}" if headroom == 1.0 else f"{headroom:g} x slo.{{}}"

  def check(self, req, worker, path, decode_tier):
    ttft = predicted_ttft_s(worker, req.prompt_len)
    if ttft is not None and ttft > self.ttft:
      return f"predicted TTFT {ttft:.2f} s > {self.limit.format('ttft_s')} {self.ttft:.2f} s"
    step = predicted_step_s(decode_tier if path.path == "disaggregated" else [worker])
    if step is not None and step > self.tpot:
      return f"predicted TPOT {step:.3f} s > {self.limit.format('tpot_s')} {self.tpot:.3f} s"
    return None
