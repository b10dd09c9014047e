"""The hybrid run (mode=hybrid, and compare_all's fourth column): instances that both prefill
and decode, TaiChi-style. It is a disaggregated run of the driver whose prefill tier is the
P-heavy instances (cluster.p_heavy) and whose decode tier is the D-heavy ones
(cluster.d_heavy), every instance running chunked prefill beside its decodes with its kind's
chunk budget (scheduler/policies/hybrid_chunked.py), and a path policy deciding per request
whether it decodes where it prefilled or moves its KV (scheduler.path: taichi, or
always_colocated / always_disagg as baselines; compare_all's hybrid run: taichi)."""

from __future__ import annotations

KINDS = {"prefill": "p_heavy", "decode": "d_heavy"}   # a hybrid run's role -> its kind


def run_config(cfg, run: str):
  """The config a run is built from: cfg itself, or for the hybrid run a copy whose
  cluster.prefill and cluster.decode are cluster.p_heavy and cluster.d_heavy (instances, tp,
  kv_pages, hosts), so the tier machinery (pools, hosts, placement) reads the hybrid tiers."""
  if run != "hybrid":
    return cfg
  out = cfg.copy_and_resolve_references()
  for role, kind in KINDS.items():
    for key in ("instances", "tp", "kv_pages", "hosts"):
      out.cluster[role][key] = cfg.cluster[kind].get(key, 0 if key == "kv_pages" else 1)
  return out


def path_name(cfg) -> str:
  """The hybrid run's path policy: scheduler.path under mode=hybrid (config.HYBRID_PATHS),
  taichi in compare_all (whose disaggregated run takes scheduler.path)."""
  return cfg.scheduler.path if cfg.mode == "hybrid" else "taichi"


def tier_budgets(cfg, run: str, token_budget: int, local_prefill: str) -> dict:
  """Prompt tokens per step on each tier of a disaggregated-like run, as a path policy
  predicts them (taichi's `tier_budgets`): hybrid, each kind's chunk_budget; otherwise whole
  prompts (the token budget) on the prefill tier and, on the decode tier, chunk_budget when
  scheduler.local_prefill=chunked."""
  if run == "hybrid":
    return {role: cfg.cluster[kind].chunk_budget for role, kind in KINDS.items()}
  return {"prefill": token_budget,
          "decode": cfg.scheduler.chunk_budget if local_prefill == "chunked" else token_budget}


def hybrid_step(cfg, max_prefill_seqs: int):
  """The hybrid run's step policy: chunked prefill with each kind's chunk budget."""
  from pdjax.scheduler.policies.hybrid_chunked import HybridChunked
  return HybridChunked(tier_budgets(cfg, "hybrid", 0, ""), max_prefill_seqs=max_prefill_seqs)
