"""The map's hybrid instances (plan.map_hybrid=instances, issue 49 item 2): mode=hybrid
placements (P-heavy + D-heavy, taichi) walked beside the three fixed kinds; their candidates,
their cells by hand, the config values, and a tiny map end to end."""

import csv
import math

import numpy as np
import pytest

from pdjax import config as config_lib
from pdjax.planning import map_instances, map_mode, map_output
from pdjax.planning import placement_runs as plan_lib
from pdjax.planning.search import Placement
from pdjax.planning.slo_grid import RunRecord, cells
from test_plan_map import _tiny_map_config

INF = math.inf


def rec(rate, ttft, tpot):
  return RunRecord(rate, np.full(10, ttft, float), np.full(10, tpot, float), np.ones(10, bool))


def test_chunk_pairs_are_a_star_capped_by_the_largest_bucket():
  assert map_instances.chunk_pairs(8192) == [(512, 256), (1024, 256), (2048, 256), (1024, 128),
                                             (1024, 512)]
  assert map_instances.chunk_pairs(1024) == [(512, 256), (1024, 256), (1024, 128), (1024, 512)]
  assert map_instances.chunk_pairs(512) == [(512, 256), (512, 128), (512, 512)]


def test_candidates_are_the_splits_times_the_pairs_on_one_host():
  splits = [Placement("disaggregated", (("prefill", 1, 4), ("decode", 1, 4))),
            Placement("disaggregated", (("prefill", 1, 8), ("decode", 2, 4)))]
  got = map_instances.placements(splits, 1024, lambda tp: tp <= 4)
  assert [p.describe() for p in got] == [
      "1xP(tp4) + 1xD(tp4) chunks 512/256", "1xP(tp4) + 1xD(tp4) chunks 1024/256",
      "1xP(tp4) + 1xD(tp4) chunks 1024/128", "1xP(tp4) + 1xD(tp4) chunks 1024/512"]
  assert {(p.run, p.mode, p.chips, p.path) for p in got} == {("hybrid", "hybrid", 8, "")}


def test_hybrid_instances_placement_config():
  cfg = config_lib.load_config_module("configs/default.py").get_config()
  cfg.backend = "sim"
  mcfg = config_lib.validate(cfg)
  pl = Placement("hybrid", (("p_heavy", 1, 2), ("d_heavy", 3, 2)), chunks=(512, 32))
  run = plan_lib.placement_config(cfg, mcfg, pl, 4.0)
  assert (run.mode, run.scheduler.path, run.cluster.p_heavy.instances,
          run.cluster.d_heavy.instances, run.cluster.p_heavy.chunk_budget,
          run.cluster.d_heavy.chunk_budget) == ("hybrid", "taichi", 1, 3, 512, 32)
  config_lib.validate(run)


# Four chips each, lattice factor 2 (per-chip goodput = rate / 4); every walk ends at a rate
# failing every cell, so each answer is a capacity.
RUNS = [
    ("colocated", "4xTP1", 4, [rec(8, 0.1, 0.03), rec(16, 0.5, 0.03), rec(32, 5.0, 0.03)],
     None),
    ("chunked", "4xTP1", 4, [], None),
    ("disaggregated", "2xP + 2xD", 4, [rec(8, 0.3, 0.015), rec(16, 5.0, 0.015)], None),
    # stage 1 (every cell): 2 per chip at TPOT 15 ms
    ("hybrid", "2xP + 2xD chunks 1024/64", 4, [rec(8, 0.1, 0.015), rec(16, 5.0, 0.015)], None),
    # stage 2 at (1.0, 0.05) only: 16 per chip, two steps above colocated's 4
    ("hybrid", "2xP + 2xD chunks 1024/32", 4, [rec(64, 0.1, 0.03), rec(128, 5.0, 0.03)],
     (1.0, 0.05)),
]


def test_instances_cells_by_hand():
  got = {(c.ttft_s, c.tpot_s): c for c in cells(RUNS, [0.2, 1.0], [0.02, 0.05], 0.9,
                                                factor=2.0)}
  c = got[(0.2, 0.02)]   # only hybrid meets it (2 per chip)
  assert (c.best["hybrid"], c.hybrid_steps, c.best_kinds, c.winner) == (
      (2.0, "2xP + 2xD chunks 1024/64"), INF, "hybrid", "none")
  c = got[(0.2, 0.05)]   # colocated 2, hybrid 2: a tie
  assert (c.hybrid_steps, c.best_kinds) == (0.0, "colocated;hybrid")
  c = got[(1.0, 0.02)]   # disaggregated 2, hybrid 2
  assert (c.hybrid_steps, c.best_kinds, c.winner) == (0.0, "disaggregated;hybrid",
                                                      "disaggregated")
  c = got[(1.0, 0.05)]   # colocated 4; hybrid's stage-2 run 16: two steps ahead
  assert (c.best["hybrid"], c.hybrid_steps, c.best_kinds) == (
      (16.0, "2xP + 2xD chunks 1024/32"), 2.0, "hybrid")
  assert map_output.cell_row("m", "h", "x", c) == {
      "model": "m", "hardware": "h", "mix": "x", "ttft_s": 1.0, "tpot_s": 0.05,
      "colocated_per_chip": 4.0, "colocated_placement": "4xTP1", "chunked_per_chip": 0.0,
      "chunked_placement": "", "disaggregated_per_chip": 2.0,
      "disaggregated_placement": "2xP + 2xD", "winner": "colocated",
      "disagg_over_aggregated": "0.50", "unsaturated": "",
      "hybrid_per_chip": 16.0, "hybrid_placement": "2xP + 2xD chunks 1024/32",
      "hybrid_over_fixed": "4.00", "hybrid_steps": "+2", "best_kinds": "hybrid"}
  assert map_output.instances_line(list(got.values())) == (
      "hybrid instances vs the best of colocated, chunked, disaggregated (rate lattice steps): "
      "within one step in 4/4 cells, ahead by >= 1 step in 2 (50%), by up to inf (only it "
      "meets) at TTFT 0.2 s / TPOT 20 ms")
  plain = cells(RUNS[:3], [0.2], [0.05], 0.9, factor=2.0)[0]
  assert plain.hybrid_steps is None and map_output.instances_line([plain]) is None


@pytest.mark.parametrize("value,want", [("instances", ["instances"]), ("off", []), ("", []),
                                        ("instances,slo_headroom",
                                         ["instances", "slo_headroom"])])
def test_map_hybrid_values(value, want):
  cfg = config_lib.load_config_module("configs/default.py").get_config()
  cfg.plan.map_hybrid = value
  assert map_mode.settings(cfg).hybrid == want


def test_map_hybrid_bad_value():
  cfg = config_lib.load_config_module("configs/default.py").get_config()
  cfg.plan.map_hybrid = "instance"
  with pytest.raises(config_lib.ConfigError) as e:
    map_mode.settings(cfg)
  # (the message predates `instances`; test_plan_map_hybrid.py pins its text)
  assert str(e.value) == ("plan.map_hybrid: unknown path policy 'instance' (known: "
                          "isl_bounding, slo_headroom)")


def test_tiny_instances_map(tmp_path):
  cfg = _tiny_map_config()
  cfg.plan.map_hybrid, cfg.plan.map_rate_max = "instances", 25600.0   # lattice x4: 400..25600
  summary = map_mode.run_map(cfg, str(tmp_path))
  assert ("tiny tpu_v5e config: hybrid instances vs the best of colocated, chunked, "
          "disaggregated (rate lattice steps): within one step in 2/2 cells, ahead by >= 1 step "
          "in 1 (50%), by up to 4.00x at TTFT 0.0004 s / TPOT 0.22 ms; "
          "unsaturated (not judged: a lower bound) 2") in summary.splitlines()
  with open(tmp_path / "map.csv") as f:
    reader = csv.DictReader(f)
    rows = list(reader)
  assert reader.fieldnames[-6:] == ["unsaturated", "hybrid_per_chip", "hybrid_placement",
                                    "hybrid_over_fixed", "hybrid_steps", "best_kinds"]
  hyb = "1xP(tp1) + 1xD(tp1) chunks 512/256"
  assert [(r["ttft_s"], r["tpot_s"], r["winner"], r["unsaturated"], r["hybrid_per_chip"],
           r["hybrid_placement"], r["hybrid_over_fixed"], r["hybrid_steps"], r["best_kinds"])
          for r in rows] == [
      ("0.0004", "0.00022", "disaggregated", "", "1600.0", hyb, "4.00", "+1", "hybrid"),
      ("0.0004", "0.01", "tie", "", "1600.0", hyb, "1.00", "+0",
       "colocated;disaggregated;hybrid"),
      ("0.01", "0.00022", "unsaturated", "chunked;hybrid", "25600.0", hyb, "", "unsaturated",
       "unsaturated"),
      ("0.01", "0.01", "unsaturated", "colocated;chunked;disaggregated;hybrid", "25600.0", hyb,
       "", "unsaturated", "unsaturated")]
  with open(tmp_path / "runs.csv") as f:
    runs = [r for r in csv.DictReader(f) if r["run"] == "hybrid"]
  assert sorted({(r["placement"], r["cell_ttft_s"], r["cell_tpot_s"]) for r in runs}) == [
      ("1xP(tp1) + 1xD(tp1) chunks 512/128", "", ""), (hyb, "", ""),
      (hyb, "0.0004", "0.00022"), (hyb, "0.0004", "0.01"), (hyb, "0.01", "0.00022"),
      (hyb, "0.01", "0.01"), ("1xP(tp1) + 1xD(tp1) chunks 512/512", "", "")]
  md = (tmp_path / "map.md").read_text()
  assert ("\n- hybrid instances (plan.map_hybrid=instances; not in the winner, in best_kinds): "
          "mode=hybrid, P-heavy + D-heavy instances on every disaggregated split's chips, chunk "
          "budgets (P-heavy/D-heavy) 512/256, 512/128, 512/512 on each, scheduler.path=taichi "
          "given slo.ttft_s=0.3 s / slo.tpot_s=5 ms, then per SLO cell the cell's best given "
          "that cell; steps = its per-chip goodput against the best fixed kind, in rate lattice "
          "steps of x4\n") in md
  assert "\n| 10 ms | +0 | U |\n| 0.22 ms | +1 | U |\n" in md
  again = tmp_path / "again"
  cfg.plan.map_runs = str(tmp_path)
  map_mode.run_map(cfg, str(again))
  assert (again / "map.csv").read_text() == (tmp_path / "map.csv").read_text()
