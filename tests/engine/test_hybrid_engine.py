"""mode=hybrid on the real engine (issue 49, item 1; tiny model, float32, local launcher): the
greedy tokens of every request equal colocated's, token for token, whichever path it took
(stayed on its P-heavy instance, prefilled and decoded on a D-heavy one, or prefilled on
P-heavy in chunks of 32 and moved its KV to D-heavy, which chunks at 8)."""

import json

from helpers.checked_run import checked_run
from pdjax import config as config_lib

ROWS = [{"id": f"{kind}{i}", "arrival_s": 0.01 * i, "prompt_len": n, "output_len": m}
        for i, (kind, n, m) in enumerate([("p", 45, 6), ("d", 30, 5), ("m", 70, 7), ("p", 9, 4),
                                          ("m", 17, 1), ("d", 61, 8), ("m", 33, 5)])]


def _cfg(tmp_path, mode: str):
  cfg = config_lib.load_config_module("configs/default.py").get_config("smoke")
  cfg.backend, cfg.mode, cfg.progress, cfg.model.dtype = "jax", mode, False, "float32"
  cfg.cluster.colocated.instances, cfg.cluster.colocated.tp = 1, 1
  for kind, budget in (("p_heavy", 32), ("d_heavy", 8)):
    tier = cfg.cluster[kind]
    tier.instances, tier.tp, tier.chunk_budget = 1, 1, budget
  cfg.scheduler.path = "helpers.hybrid_paths:ById"
  trace = tmp_path / "trace.jsonl"
  trace.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
  cfg.workload.kind, cfg.workload.path = "jsonl", str(trace)
  cfg.workload.num_requests = len(ROWS)
  return cfg


def test_hybrid_greedy_tokens_equal_colocated(tmp_path):
  _, colocated, _ = checked_run(_cfg(tmp_path, "colocated"), "colocated")
  summary, hybrid, _ = checked_run(_cfg(tmp_path, "hybrid"), "hybrid")
  assert [r.id for r in hybrid.requests] == [r["id"] for r in ROWS]
  assert [len(r.output_ids) for r in hybrid.requests] == [r["output_len"] for r in ROWS]
  assert {r.id: r.output_ids for r in hybrid.requests} == {
      r.id: r.output_ids for r in colocated.requests}
  where = {r.id: (r.prefill_instance, r.decode_instance) for r in hybrid.requests}
  assert where == {"p0": ("prefill-0", "prefill-0"), "d1": ("decode-0", "decode-0"),
                   "m2": ("prefill-0", "decode-0"), "p3": ("prefill-0", "prefill-0"),
                   "m4": ("prefill-0", None), "d5": ("decode-0", "decode-0"),
                   "m6": ("prefill-0", "decode-0")}   # (m4: one token, done at its prefill)
  assert len(hybrid.transfers) == 2 and all(t["ok"] for t in hybrid.transfers)
  assert summary["kv_pages_leaked"] == 0
  chunks = {s["instance"]: set() for s in hybrid.steps}
  for s in hybrid.steps:
    if s["kind"] != "decode":
      chunks[s["instance"]].add(s["num_tokens"])
  assert max(chunks["prefill-0"]) == 32 and max(chunks["decode-0"]) == 8
