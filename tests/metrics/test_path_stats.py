"""summary.json "paths" and report.md "Paths" (metrics/path_stats.py): requests counted by
path and by the policy's reason; the predicted TTFT/TPOT of the path taken against the
measured, as |error| / measured (median, p90)."""

from pdjax.metrics.path_stats import path_section, path_stats
from pdjax.request import Request, SamplingParams, Status


def _req(i, path, reason, ttft=None, tpot=None, status=Status.FINISHED):
  r = Request(id=f"r{i}", arrival_s=0.0, prompt_ids=[1, 2, 3],
              sampling=SamplingParams(max_new_tokens=3))
  r.path, r.path_reason, r.status = path, reason, status
  if ttft is not None:                      # three tokens: TTFT, then TPOT apart
    r.token_times = [ttft, ttft + tpot, ttft + 2 * tpot]
  return r


def _reason(choice, why, remote=None, local=None):
  return {"policy": "slo_headroom", "choice": choice, "why": why,
          "remote": remote and {"ttft_s": remote[0], "tpot_s": remote[1]},
          "local": local and {"ttft_s": local[0], "tpot_s": local[1]}}


def test_counts_and_prediction_error_of_the_path_taken():
  requests = [
      _req(0, "disaggregated", _reason("disaggregated", "larger headroom", (1.2, 0.1),
                                       (9.0, 9.0)), ttft=1.0, tpot=0.1),   # errors 0.2, 0
      _req(1, "colocated", _reason("colocated", "larger headroom", (9.0, 9.0), (0.5, 0.25)),
           ttft=1.0, tpot=0.2),                                          # errors 0.5, 0.25
      _req(2, "disaggregated", _reason("disaggregated", "unmeasured: remote, local"),
           ttft=1.0, tpot=0.1),                                          # nothing predicted
      _req(3, "disaggregated", {"policy": "always_disagg", "choice": "disaggregated"},
           ttft=1.0, tpot=0.1),
      _req(4, "", None, status=Status.REJECTED),                        # never routed
  ]
  stats = path_stats(requests)
  assert stats["by_path"] == {"disaggregated": 3, "colocated": 1}
  assert stats["by_reason"] == {"slo_headroom: larger headroom -> disaggregated": 1,
                                "slo_headroom: larger headroom -> colocated": 1,
                                "slo_headroom: unmeasured: remote, local -> disaggregated": 1,
                                "always_disagg -> disaggregated": 1}
  ttft, tpot = stats["prediction_error"]["ttft"], stats["prediction_error"]["tpot"]
  assert ttft["n"] == tpot["n"] == 2
  assert abs(ttft["p50"] - 0.35) < 1e-12 and abs(tpot["p50"] - 0.125) < 1e-12
  lines = path_section(stats)
  assert lines[:3] == ["## Paths", "", "- By path: colocated 1, disaggregated 3"]
  assert "- TTFT prediction error (|predicted - measured| / measured, 2 requests): median " \
         "35.0%, p90 47.0%" in lines


def test_no_predictions_no_error_lines():
  stats = path_stats([_req(0, "disaggregated", {"policy": "always_disagg",
                                                "choice": "disaggregated"}, 1.0, 0.1)])
  assert stats["prediction_error"] == {}
  assert path_section(stats) == ["## Paths", "", "- By path: disaggregated 1",
                                 "- always_disagg -> disaggregated: 1", ""]
