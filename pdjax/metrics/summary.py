"""Per-run serving metrics, defined as in DistServe and `vllm bench serve`.

TTFT: arrival -> first token. TPOT: (E2E - TTFT) / (output_len - 1), only for
output_len > 1. ITL: gaps between consecutive tokens. E2E: arrival -> last token.
SLO attainment counts every request (rejected and failed ones are misses) except those their
client cancelled; slo_attainment_admitted leaves rejected ones out too (what an admission
policy protects); goodput is the rate of requests that met both the TTFT and the TPOT SLO.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pdjax.metrics.host_time import host_overhead, host_time
from pdjax.metrics.path_stats import path_stats
from pdjax.metrics.timeline import preemption_count, rejects_by_reason, tier_stats
from pdjax.request import Request, Status


def percentiles(values: Sequence[float]) -> dict:
  """mean/p50/p90/p99 (linear interpolation); all None for no values."""
  if len(values) == 0:
    return {"mean": None, "p50": None, "p90": None, "p99": None}
  arr = np.asarray(values, dtype=np.float64)
  p50, p90, p99 = np.percentile(arr, [50, 90, 99])
  return {"mean": float(arr.mean()), "p50": float(p50), "p90": float(p90),
          "p99": float(p99)}


def meets_slo(req: Request, slo_ttft_s: float, slo_tpot_s: float) -> bool:
  """Finished, first token within slo_ttft_s, and (if defined) TPOT within slo_tpot_s."""
  if req.status != Status.FINISHED or req.ttft_s is None:
    return False
  tpot = req.tpot_s
  return req.ttft_s <= slo_ttft_s and (tpot is None or tpot <= slo_tpot_s)


def _transfer_stats(transfers: Sequence[dict]) -> dict:
  ok = [t for t in transfers if t["ok"]]
  seconds = percentiles([float(t["seconds"]) for t in ok])
  return {
      "count": len(ok),
      "bytes": int(sum(int(t["bytes"]) for t in ok)),
      "mean_s": seconds["mean"],
      "p99_s": seconds["p99"],
      "failures": len(transfers) - len(ok),
  }


def _exposed_stats(requests: Sequence[Request]) -> dict:
  """The landed transfers' exposed part (Request.transfer_exposed_s: after the prefill ended;
  kv.stream_layers hides the rest behind the prefill)."""
  exposed = percentiles([r.transfer_exposed_s for r in requests
                         if r.transfer_exposed_s is not None])
  return {"exposed_mean_s": exposed["mean"], "exposed_p99_s": exposed["p99"]}


def summarize(requests: Sequence[Request], *, mode: str, duration_s: float,
              slo_ttft_s: float, slo_tpot_s: float, transfers: Sequence[dict],
              compiles: int, kv_pages_leaked: int, compiles_from_cache: int = 0) -> dict:
  """The summary.json dict for one run (key names are a contract). compiles: programs XLA
  compiled; compiles_from_cache: programs a compilation cache served instead (JAX's persistent
  cache, or its in-process one for a program built again on the same devices)."""
  if duration_s <= 0:
    raise ValueError(f"duration_s must be > 0, got {duration_s}")
  for r in requests:
    if not r.status.terminal:
      raise ValueError(f"request {r.id} is not terminal ({r.status.value})")
  finished = [r for r in requests if r.status == Status.FINISHED]
  num_good = sum(meets_slo(r, slo_ttft_s, slo_tpot_s) for r in requests)
  output_tokens = sum(len(r.output_ids) for r in finished)
  num_cancelled = sum(r.status == Status.CANCELLED for r in requests)
  judged = len(requests) - num_cancelled
  admitted = judged - sum(r.status == Status.REJECTED for r in requests)
  return {
      "mode": mode,
      "duration_s": duration_s,
      "slo": {"ttft_s": slo_ttft_s, "tpot_s": slo_tpot_s},
      "requests": {
          "total": len(requests),
          "finished": len(finished),
          "rejected": sum(r.status == Status.REJECTED for r in requests),
          "failed": sum(r.status == Status.FAILED for r in requests),
          "cancelled": num_cancelled,
      },
      "ttft_s": percentiles([r.ttft_s for r in finished if r.ttft_s is not None]),
      "tpot_s": percentiles([r.tpot_s for r in finished if r.tpot_s is not None]),
      "itl_s": percentiles([g for r in finished for g in r.itl_s]),
      "e2e_s": percentiles([r.e2e_s for r in finished if r.e2e_s is not None]),
      "slo_attainment": num_good / judged if judged else 0.0,
      "slo_attainment_admitted": num_good / admitted if admitted else 0.0,
      "goodput_rps": num_good / duration_s,
      "output_tok_s": output_tokens / duration_s,
      "kv_transfer": {**_transfer_stats(transfers), **_exposed_stats(requests)},
      "compiles": compiles,
      "compiles_from_cache": compiles_from_cache,
      "kv_pages_leaked": kv_pages_leaked,
  }


def summarize_extras(requests: Sequence[Request], *, duration_s: float,
                     steps: Sequence[dict] = (), samples: Sequence[dict] = (),
                     role_switches: Sequence[dict] = (),
                     remesh_events: Sequence[dict] = ()) -> dict:
  """Optional sections beyond summarize()'s contract, to merge into the summary
  (summary.update(...)) or pass as write_run_files(extras=...): "preemptions" (int),
  "rejects_by_reason" ({reason: count}), "tiers" (timeline.tier_stats), "host_overhead"
  ({tier: share of time its devices waited for the host}) and "host_time" (per-tier host
  phase times; see pdjax.metrics.host_time), "role_switches" (the list as given), "paths"
  (metrics.path_stats: requests by path and reason, the path predictions' error) and
  "remesh_events" (scheduler/remesh.py: one per re-mesh, its layouts, phase seconds and moved
  requests)."""
  return {
      "preemptions": preemption_count(requests),
      "rejects_by_reason": rejects_by_reason(requests),
      "tiers": tier_stats(steps, samples, duration_s),
      "host_overhead": host_overhead(steps),
      "host_time": host_time(steps),
      "role_switches": [dict(sw) for sw in role_switches],
      "paths": path_stats(requests),
      "remesh_events": [dict(e) for e in remesh_events],
  }
