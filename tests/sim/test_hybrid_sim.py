"""mode=hybrid on the simulator (issue 49, item 1): P-heavy and D-heavy instances that both
prefill and decode, each chunking prompts at its own chunk_budget; every request ends, no page
leaks; the hybrid run's config errors are one line."""

import json

import pytest

from helpers.checked_run import checked_run
from pdjax import config as config_lib
from pdjax.metrics.hybrid import hybrid_section


def _cfg(tmp_path, rows, **kinds):
  """The smoke config on the simulator in mode=hybrid, one P-heavy (chunk 64) and one D-heavy
  (chunk 16) instance at TP1, serving `rows` (jsonl trace rows)."""
  cfg = config_lib.load_config_module("configs/default.py").get_config("smoke")
  cfg.backend, cfg.mode, cfg.progress = "sim", "hybrid", False
  cfg.scheduler.path = "helpers.hybrid_paths:ById"
  for kind, budget in (("p_heavy", 64), ("d_heavy", 16)):
    tier = cfg.cluster[kind]
    tier.instances, tier.tp, tier.chunk_budget = 1, 1, kinds.get(kind, budget)
  trace = tmp_path / "trace.jsonl"
  trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
  cfg.workload.kind, cfg.workload.path = "jsonl", str(trace)
  cfg.workload.num_requests = len(rows)
  return cfg


def _prefill_chunks(result) -> dict:
  """{instance: prompt tokens of each of its steps that carried a chunk, in order} (one
  request at a time on an instance here: a step's tokens are its chunk, or its chunk and one
  decode row when the step ran beside a decode)."""
  out = {}
  for s in result.steps:
    if s["kind"] != "decode":
      out.setdefault(s["instance"], []).append(s["num_tokens"])
  return out


def test_each_kind_chunks_a_prompt_at_its_own_budget(tmp_path):
  """A 100-token prompt: on the P-heavy instance (chunk 64) in steps of 64 and 36 tokens; on
  the D-heavy one (chunk 16) in six of 16 and one of 4. 'p' stays on P-heavy, 'd' runs on
  D-heavy, 'm' prefills on P-heavy after 'p' is done and moves its KV to D-heavy (one
  transfer, 7 pages of 16 tokens)."""
  rows = [{"id": "p0", "arrival_s": 0.0, "prompt_len": 100, "output_len": 4},
          {"id": "d0", "arrival_s": 0.0, "prompt_len": 100, "output_len": 4},
          {"id": "m0", "arrival_s": 1.0, "prompt_len": 100, "output_len": 4}]
  summary, result, instances = checked_run(_cfg(tmp_path, rows), "hybrid")
  assert _prefill_chunks(result) == {"prefill-0": [64, 36, 64, 36],
                                     "decode-0": [16, 16, 16, 16, 16, 16, 4]}
  where = {r.id: (r.path, r.prefill_instance, r.decode_instance) for r in result.requests}
  assert where == {"p0": ("colocated", "prefill-0", "prefill-0"),
                   "d0": ("colocated", "decode-0", "decode-0"),
                   "m0": ("disaggregated", "prefill-0", "decode-0")}
  assert [len(r.output_ids) for r in result.requests] == [4, 4, 4]
  assert len(result.transfers) == 1 and result.transfers[0]["ok"]
  assert summary["kv_pages_leaked"] == 0
  assert summary["run_info"]["placement"]["describe"] == "1xPH(tp1) + 1xDH(tp1)"
  by_id = {r.id: r for r in result.requests}
  kinds = summary["hybrid"]
  assert kinds["paths"] == {"p_heavy": 1, "p_heavy_to_d_heavy": 1, "d_heavy": 1}
  assert kinds["transfers"] == 1
  assert kinds["p_heavy"] == {
      "instances": 1, "chunk_budget": 64, "prefilled": 2, "decoded": 1,
      "ttft_mean_s": (by_id["p0"].ttft_s + by_id["m0"].ttft_s) / 2,
      "tpot_mean_s": by_id["p0"].tpot_s, "chunk_steps": 4, "max_step_tokens": 64}
  assert kinds["d_heavy"] == {
      "instances": 1, "chunk_budget": 16, "prefilled": 1, "decoded": 2,
      "ttft_mean_s": by_id["d0"].ttft_s,
      "tpot_mean_s": (by_id["d0"].tpot_s + by_id["m0"].tpot_s) / 2, "chunk_steps": 7,
      "max_step_tokens": 16}
  ms = {k: f"{kinds[k]['ttft_mean_s'] * 1e3:.1f}" for k in ("p_heavy", "d_heavy")}
  tpot = {k: f"{kinds[k]['tpot_mean_s'] * 1e3:.1f}" for k in ("p_heavy", "d_heavy")}
  assert hybrid_section(kinds) == [
      "## Hybrid instances", "",
      "| kind | instances | chunk budget | prefilled | decoded | TTFT mean (ms) | "
      "TPOT mean (ms) | largest step (tokens) |",
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
      f"| P-heavy | 1 | 64 | 2 | 1 | {ms['p_heavy']} | {tpot['p_heavy']} | 64 |",
      f"| D-heavy | 1 | 16 | 1 | 2 | {ms['d_heavy']} | {tpot['d_heavy']} | 16 |", "",
      "- Paths: 1 stayed on P-heavy, 1 moved their KV to D-heavy (1 transfers landed), 1 ran "
      "on D-heavy", ""]


def test_chunk_budgets_swapped_swap_the_chunks(tmp_path):
  """The chunk sizes come from the kinds' keys, not from the roles: P-heavy at 16 and
  D-heavy at 64 chunk the same prompts the other way round."""
  rows = [{"id": "p0", "arrival_s": 0.0, "prompt_len": 40, "output_len": 2},
          {"id": "d0", "arrival_s": 0.0, "prompt_len": 40, "output_len": 2}]
  _, result, _ = checked_run(_cfg(tmp_path, rows, p_heavy=16, d_heavy=64), "hybrid")
  assert _prefill_chunks(result) == {"prefill-0": [16, 16, 8], "decode-0": [40]}


def test_taichi_on_a_busy_workload_ends_every_request_and_leaks_nothing():
  """taichi on the smoke workload, 40 requests at 200 req/s with SLOs so tight that TPOT is
  at risk: some requests move to the D-heavy tier, the rest stay; every request finishes and
  every page is back."""
  cfg = config_lib.load_config_module("configs/default.py").get_config("smoke")
  cfg.backend, cfg.mode, cfg.progress = "sim", "hybrid", False
  cfg.scheduler.path = "taichi"
  cfg.workload.num_requests, cfg.workload.rate = 40, 200.0
  cfg.slo.ttft_s, cfg.slo.tpot_s = 0.0003, 0.00021
  summary, result, _ = checked_run(cfg, "hybrid")
  whys = {r.path_reason["why"] for r in result.requests}
  assert {r.path for r in result.requests} == {"colocated", "disaggregated"}
  assert "tpot at risk: shortest steps on the d_heavy pick" in whys
  assert len(result.transfers) == sum(r.path == "disaggregated" for r in result.requests)
  assert summary["kv_pages_leaked"] == 0


@pytest.mark.parametrize("overrides,error", [
    (dict(path="slo_headroom"),
     "scheduler.path='slo_headroom' is not a path of mode=hybrid (built-in: taichi, "
     "always_colocated, always_disagg; or your own)"),
    (dict(p_budget=0),
     "cluster.p_heavy.chunk_budget=0 must be within [1, 512] (the largest prefill bucket)"),
    (dict(d_budget=600),
     "cluster.d_heavy.chunk_budget=600 must be within [1, 512] (the largest prefill bucket)"),
    (dict(role_switch="queue_balance"),
     "scheduler.role_switch='queue_balance' must be none with mode=hybrid (its instances keep "
     "their kind)"),
    (dict(d_tp=3), "cluster.d_heavy.tp=3 does not divide the model's num_kv_heads=4"),
])
def test_hybrid_config_errors_are_one_line(overrides, error):
  cfg = config_lib.load_config_module("configs/default.py").get_config("smoke")
  cfg.backend, cfg.mode, cfg.scheduler.path = "sim", "hybrid", "taichi"
  s, c = cfg.scheduler, cfg.cluster
  s.path = overrides.get("path", s.path)
  s.role_switch = overrides.get("role_switch", s.role_switch)
  c.p_heavy.chunk_budget = overrides.get("p_budget", c.p_heavy.chunk_budget)
  c.d_heavy.chunk_budget = overrides.get("d_budget", c.d_heavy.chunk_budget)
  c.d_heavy.tp = overrides.get("d_tp", c.d_heavy.tp)
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg)
  assert str(e.value) == error


def test_each_kind_sizes_its_own_kv_pool(tmp_path):
  """cluster.p_heavy.kv_pages and cluster.d_heavy.kv_pages size the hybrid instances' pools
  (not cluster.prefill's and cluster.decode's, which the hybrid run's tiers stand in for)."""
  cfg = _cfg(tmp_path, [{"id": "p0", "arrival_s": 0.0, "prompt_len": 20, "output_len": 2}])
  cfg.cluster.p_heavy.kv_pages, cfg.cluster.d_heavy.kv_pages = 48, 40
  cfg.cluster.prefill.kv_pages, cfg.cluster.decode.kv_pages = 64, 64
  _, _, instances = checked_run(cfg, "hybrid")
  assert {i.name: i.tables.allocator.num_pages for i in instances} == {
      "prefill-0": 48, "decode-0": 40}
