"""summary.json's `hybrid` section: a hybrid run's numbers per kind of instance (mode=hybrid,
compare_all's hybrid run). Its P-heavy instances are the driver's prefill tier (prefill-<i>),
its D-heavy ones the decode tier (decode-<i>). Pure Python.

  {"p_heavy": {"instances", "chunk_budget", "prefilled", "decoded", "ttft_mean_s",
               "tpot_mean_s", "chunk_steps", "max_step_tokens"},
   "d_heavy": {... the same},
   "paths": {"p_heavy": stayed on P-heavy, "p_heavy_to_d_heavy": moved their KV,
             "d_heavy": prefilled and decoded on D-heavy},
   "transfers": KV transfers that landed}

`prefilled` and `ttft_mean_s` count the finished requests whose prompt ran on that kind (the
TTFT is that prefill's), `decoded` and `tpot_mean_s` those that decoded there (a request done
at its prefill, one token, decodes nowhere); chunk_steps counts the steps that carried a prompt
chunk there, max_step_tokens the most tokens one step carried (chunk and decode rows: at most
the kind's chunk_budget).
"""

from __future__ import annotations

KIND_OF_ROLE = {"prefill": "p_heavy", "decode": "d_heavy"}
LABELS = {"p_heavy": "P-heavy", "d_heavy": "D-heavy"}


def _kind(instance: str | None) -> str | None:
  return None if not instance else KIND_OF_ROLE.get(instance.rsplit("-", 1)[0])


def _mean(values: list) -> float | None:
  return sum(values) / len(values) if values else None


def hybrid_summary(requests, transfers, steps, tiers: dict) -> dict:
  """tiers: {kind: (instances, chunk_budget)} (cluster.p_heavy, cluster.d_heavy)."""
  out = {kind: {"instances": n, "chunk_budget": budget, "prefilled": 0, "decoded": 0,
                "ttft_mean_s": None, "tpot_mean_s": None, "chunk_steps": 0,
                "max_step_tokens": 0}
         for kind, (n, budget) in tiers.items()}
  ttft = {kind: [] for kind in out}
  tpot = {kind: [] for kind in out}
  paths = {"p_heavy": 0, "p_heavy_to_d_heavy": 0, "d_heavy": 0}
  for r in requests:
    if r.status.value != "finished":
      continue
    first, then = _kind(r.prefill_instance), _kind(r.decode_instance)
    if first in out:
      out[first]["prefilled"] += 1
      if r.ttft_s is not None:
        ttft[first].append(r.ttft_s)
    if then in out:
      out[then]["decoded"] += 1
      if r.tpot_s is not None:
        tpot[then].append(r.tpot_s)
    if first == "p_heavy" and then == "d_heavy":
      paths["p_heavy_to_d_heavy"] += 1
    elif first in paths:
      paths[first] += 1
  for kind in out:
    out[kind]["ttft_mean_s"], out[kind]["tpot_mean_s"] = _mean(ttft[kind]), _mean(tpot[kind])
  for s in steps:
    kind = KIND_OF_ROLE.get(s["role"])
    if kind in out and s["kind"] != "decode":
      out[kind]["chunk_steps"] += 1
      out[kind]["max_step_tokens"] = max(out[kind]["max_step_tokens"], int(s["num_tokens"]))
  return {**out, "paths": paths, "transfers": sum(bool(t.get("ok")) for t in transfers)}


def hybrid_section(h: dict) -> list[str]:
  """report.md's "Hybrid instances" section: the `hybrid` summary as a table per kind."""
  from pdjax.metrics.report_sections import md_table

  def ms(value) -> str:
    return "-" if value is None else f"{value * 1e3:.1f}"
  rows = [[LABELS[kind], str(k["instances"]),
           str(k["chunk_budget"]), str(k["prefilled"]), str(k["decoded"]), ms(k["ttft_mean_s"]),
           ms(k["tpot_mean_s"]), str(k["max_step_tokens"])]
          for kind, k in h.items() if kind in LABELS]
  paths = h["paths"]
  return (["## Hybrid instances", ""]
          + md_table(["kind", "instances", "chunk budget", "prefilled", "decoded",
                      "TTFT mean (ms)", "TPOT mean (ms)", "largest step (tokens)"], rows)
          + ["", f"- Paths: {paths['p_heavy']} stayed on P-heavy, {paths['p_heavy_to_d_heavy']} "
             f"moved their KV to D-heavy ({h['transfers']} transfers landed), "
             f"{paths['d_heavy']} ran on D-heavy", ""])
