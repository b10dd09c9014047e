"""The planner on a trace workload: its rows' lengths, resampled, at Poisson rates (the map's
`workload` mix and the plain planner alike), and map.md's length percentiles of the trace."""

import csv
import json
import os

import pytest

from helpers.paths import FIXTURES
from pdjax import config as config_lib
from pdjax.planning import placement_runs as plan_lib
from pdjax.planning import map_mode, workload_mix
from pdjax.planning.search import Placement
from pdjax.workload.loader import load_workload
from test_plan_map import _tiny_map_config

AZURE = os.path.join(FIXTURES, "azure_small.csv")


def test_a_map_of_a_traces_lengths(tmp_path):
  cfg = _tiny_map_config()
  cfg.workload.kind, cfg.workload.path = "azure", AZURE
  cfg.plan.map_mixes = "workload"
  map_mode.run_map(cfg, str(tmp_path))
  with open(tmp_path / "runs.csv") as f:
    runs = list(csv.DictReader(f))
  assert runs and {r["mix"] for r in runs} == {"workload"}
  # The trace's 5 good rows, as (prompt, output) pairs; fitted into max_model_len=512:
  # (2048, 28) -> (484, 28) and (200, 600) -> (1, 511).
  pairs = {(374, 44), (396, 109), (2048, 28), (200, 600), (50, 20)}
  with open(tmp_path / "workload_resampled.jsonl") as f:
    rows = [json.loads(line) for line in f]
  assert {(r["prompt_len"], r["output_len"]) for r in rows} <= pairs
  assert len({(r["prompt_len"], r["output_len"]) for r in rows}) == 5
  # A run's requests: the resampled rows at Poisson arrivals scaled to its rate.
  c, mcfg, trace = map_mode.combo(cfg, "tiny", "tpu_v5e", "workload", str(tmp_path / "x"))
  pl = Placement("colocated", (("colocated", 2, 1),))
  run_cfg = plan_lib.placement_config(c, mcfg, pl, 800.0, trace)
  requests, _ = load_workload(run_cfg.workload, seed=0, vocab_size=mcfg.vocab_size,
                              eos_ids=mcfg.eos_token_ids, max_model_len=512)
  n = 30        # plan.num_requests (800 req/s x min_duration_s=0 is fewer)
  expect = trace.rows(n)
  assert len(requests) == n
  assert [(len(r.prompt_ids), r.sampling.max_new_tokens) for r in requests] == [
      (min(e["prompt_len"], 512 - min(e["output_len"], 511)), min(e["output_len"], 511))
      for e in expect]
  assert [r.arrival_s for r in requests] == pytest.approx([e["arrival_s"] / 800 for e in expect])
  assert {(len(r.prompt_ids), r.sampling.max_new_tokens) for r in requests} <= {
      (374, 44), (396, 109), (484, 28), (1, 511), (50, 20)}
  md = (tmp_path / "map.md").read_text()
  assert ("\n- workload mixes: workload = azure trace azure_small.csv (5 rows): its lengths "
          "resampled, Poisson arrivals; at the lattice's rates") in md
  # Nearest rank of 5: p50 the 3rd, p90 and p99 the 5th smallest. Prompts 1, 50, 374, 396, 484;
  # outputs 20, 28, 44, 109, 511.
  assert ("\nworkload lengths (tokens, of the 5 rows of azure_small.csv): prompt p50 374, p90 "
          "484, p99 484; output p50 44, p90 511, p99 511\n") in md


def test_a_trace_is_planned_from_its_lengths(tmp_path):
  cfg = _tiny_map_config()
  cfg.workload.kind, cfg.workload.path = "azure", AZURE
  mcfg = config_lib.validate(cfg)
  pl = Placement("colocated", (("colocated", 2, 1),))
  with pytest.raises(ValueError):            # replaying the trace at its own times: refused
    plan_lib.placement_config(cfg, mcfg, pl, 100.0)
  trace = workload_mix.trace_lengths(cfg, mcfg, str(tmp_path / "w.jsonl"))
  assert trace.pairs.tolist() == [[374, 44], [396, 109], [2048, 28], [200, 600], [50, 20]]
  first = trace.rows(3)
  assert trace.rows(2000)[:3] == first       # row i does not depend on how many are drawn
  run_cfg = plan_lib.placement_config(cfg, mcfg, pl, 100.0, trace)
  assert (run_cfg.workload.kind, run_cfg.workload.num_requests, run_cfg.workload.time_scale) \
      == ("jsonl", 30, 0.01)
  assert plan_lib.evaluate(cfg, mcfg, pl, 100.0, trace).ttft.shape == (30,)
