"""Net benefit of disaggregation per prompt-length bucket, from a colocated and a
disaggregated run of the same requests.

For every request id that FINISHED in both runs:
  prefill_saved_s = colocated TTFT - disaggregated TTFT
  kv_transfer_s   = disaggregated transfer_s
  decode_extra_s  = (disaggregated TPOT - colocated TPOT) * (output_len - 1), with
                    output_len the disaggregated run's; 0 when output_len <= 1 or either
                    TPOT is undefined
  net_s           = prefill_saved_s - kv_transfer_s - decode_extra_s
A positive net_s means disaggregation paid off for that bucket (the seeds' accounting;
whether the transfer also shows in the TTFT or TPOT difference depends on where the engine
stamps the first token, so read kv_transfer_s next to the other terms).
"""

from __future__ import annotations

from collections.abc import Sequence

from pdjax.metrics.intervals import interval
from pdjax.request import Request, Status

FIELDS = ("prefill_saved_s", "kv_transfer_s", "decode_extra_s", "net_s")


def request_benefit(colo: Request, disagg: Request) -> dict | None:
  """The four terms for one request pair; None unless both finished with a first token."""
  if colo.status != Status.FINISHED or disagg.status != Status.FINISHED:
    return None
  if colo.ttft_s is None or disagg.ttft_s is None:
    return None
  saved = colo.ttft_s - disagg.ttft_s
  transfer = float(disagg.transfer_s)
  out_len = disagg.output_len
  if out_len <= 1 or colo.tpot_s is None or disagg.tpot_s is None:
    extra = 0.0
  else:
    extra = (disagg.tpot_s - colo.tpot_s) * (out_len - 1)
  return {"prefill_saved_s": saved, "kv_transfer_s": transfer, "decode_extra_s": extra,
          "net_s": saved - transfer - extra}


def _bucket(prompt_len: int, edges: Sequence[int]) -> int | None:
  """Index of [edges[i], edges[i+1]) holding prompt_len (last: [edges[-1], inf))."""
  if prompt_len < edges[0]:
    return None
  idx = 0
  for i, e in enumerate(edges):
    if prompt_len >= e:
      idx = i
  return idx


def net_benefit(colocated: Sequence[Request], disaggregated: Sequence[Request],
                bucket_edges: Sequence[int]) -> list[dict]:
  """One row per bucket [edge_i, edge_{i+1}) plus a last open bucket [edge_-1, inf):
  {"lo", "hi" (None for the open one), "n", the mean of each of FIELDS (None when n == 0),
  and "net_s_half_width": the 95% interval's half-width of the mean net_s over the bucket's
  requests (None when n < 2)}. Buckets use the colocated request's prompt_len; prompts
  shorter than the first edge are left out. Requests are matched by id."""
  return net_benefit_pooled([(colocated, disaggregated)], bucket_edges)


def net_benefit_pooled(pairs: Sequence[tuple[Sequence[Request], Sequence[Request]]],
                       bucket_edges: Sequence[int]) -> list[dict]:
  """net_benefit over the requests of several (colocated, disaggregated) run pairs (e.g. one
  pair per repeat): requests are matched by id within a pair and pooled into the buckets."""
  edges = sorted(int(e) for e in bucket_edges)
  if not edges:
    raise ValueError("bucket_edges must not be empty")
  if len(set(edges)) != len(edges):
    raise ValueError(f"bucket_edges must be distinct, got {list(bucket_edges)}")
  terms_by_bucket: list[list[dict]] = [[] for _ in edges]
  for colocated, disaggregated in pairs:
    by_id = {r.id: r for r in disaggregated}
    for colo in colocated:
      disagg = by_id.get(colo.id)
      if disagg is None:
        continue
      terms = request_benefit(colo, disagg)
      b = _bucket(colo.prompt_len, edges)
      if terms is not None and b is not None:
        terms_by_bucket[b].append(terms)
  rows = []
  for i, lo in enumerate(edges):
    terms = terms_by_bucket[i]
    n = len(terms)
    rows.append({"lo": lo, "hi": edges[i + 1] if i + 1 < len(edges) else None, "n": n,
                 **{f: (sum(t[f] for t in terms) / n if n else None) for f in FIELDS},
                 "net_s_half_width": interval([t["net_s"] for t in terms])["half_width"]})
  return rows
