"""The planner's map over a real trace mix: `plan.map_mixes=workload` on the shipped sample of
the Azure LLM inference trace 2023 (tests/fixtures/azure_llm_2023/conv_first_1000.csv, the
conversation trace's first 1,000 rows), the tiny model on a 2 x 2 SLO grid (~10 s)."""

import csv
import json
import math
import os

from helpers.paths import FIXTURES
from pdjax.planning import map_mode
from pdjax.workload.traces import read_azure
from test_plan_map import _tiny_map_config

CONV = os.path.join(FIXTURES, "azure_llm_2023", "conv_first_1000.csv")


def _nearest_rank(values, q):
  ordered = sorted(values)
  return ordered[math.ceil(q / 100 * len(ordered)) - 1]


def test_a_map_of_the_real_conversation_sample(tmp_path):
  cfg = _tiny_map_config()
  cfg.workload.kind, cfg.workload.path = "azure", CONV
  cfg.plan.map_mixes = "workload"
  # 2,048 tokens keep 905 of the 1,000 rows whole (95 have prompt + output > 2,048).
  cfg.kv.max_model_len, cfg.kv.pages_per_instance = 2048, 1024
  cfg.scheduler.prefill_buckets, cfg.scheduler.chunk_budget = (512, 2048), 512
  cfg.plan.num_requests = 200
  cfg.plan.map_ttft_s, cfg.plan.map_tpot_s = (0.005, 0.05), (0.0003, 0.01)
  cfg.plan.map_rate_min, cfg.plan.map_rate_max = 100.0, 800.0   # lattice 100, 200, 400, 800
  cfg.plan.map_rate_factor, cfg.plan.map_rate_start = 2.0, 200.0
  map_mode.run_map(cfg, str(tmp_path))

  rows, _ = read_azure(CONV)
  assert sum(r.prompt_len + r.output_len > 2048 for r in rows) == 95
  # The runs' requests are the sample's own (prompt, output) pairs, resampled.
  with open(tmp_path / "workload_resampled.jsonl") as f:
    drawn = {(r["prompt_len"], r["output_len"]) for r in map(json.loads, f)}
  assert drawn <= {(r.prompt_len, r.output_len) for r in rows}
  md = (tmp_path / "map.md").read_text()
  assert ("\n- workload mixes: workload = azure trace conv_first_1000.csv (1000 rows): its "
          "lengths resampled, Poisson arrivals; at the lattice's rates") in md
  # The printed percentiles are of the 1,000 rows fitted into 2,048 tokens (prompt first cut).
  fitted = [(min(r.prompt_len, 2048 - min(r.output_len, 2047)), min(r.output_len, 2047))
            for r in rows]
  prompt = [_nearest_rank([p for p, _ in fitted], q) for q in (50, 90, 99)]
  output = [_nearest_rank([o for _, o in fitted], q) for q in (50, 90, 99)]
  assert (prompt, output) == ([999, 1378, 2011], [203, 428, 585])
  assert ("\nworkload lengths (tokens, of the 1000 rows of conv_first_1000.csv): prompt p50 999, "
          "p90 1378, p99 2011; output p50 203, p90 428, p99 585\n") in md

  with open(tmp_path / "runs.csv") as f:
    runs = list(csv.DictReader(f))
  assert {(r["mix"], r["run"], r["placement"], r["requests"]) for r in runs} == {
      ("workload", "colocated", "2xTP1", "200"), ("workload", "chunked", "2xTP1", "200"),
      ("workload", "disaggregated", "1xP(tp1) + 1xD(tp1)", "200")}
  with open(tmp_path / "map.csv") as f:
    cells = [(r["ttft_s"], r["tpot_s"], r["colocated_per_chip"], r["chunked_per_chip"],
              r["disaggregated_per_chip"], r["winner"], r["disagg_over_aggregated"])
             for r in csv.DictReader(f)]
  # Every kind holds 200 req/s/chip at the loose TPOT; at 0.3 ms the disaggregated split's
  # one decode instance holds only 100 (attainment 0.98 at 200, under the loosest SLO too).
  assert cells == [
      ("0.005", "0.0003", "200.0", "200.0", "100.0", "colocated", "0.50"),
      ("0.005", "0.01", "200.0", "200.0", "200.0", "tie", "1.00"),
      ("0.05", "0.0003", "200.0", "200.0", "100.0", "colocated", "0.50"),
      ("0.05", "0.01", "200.0", "200.0", "200.0", "tie", "1.00")]
