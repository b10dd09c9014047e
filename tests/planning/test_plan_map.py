"""The planner's map mode: SLO cells from per-request arrays computed by hand, the rate walk,
the map's placements and mixes, a tiny map end to end against the runs' own attainment and
naming what ran, and a bad map config's one-line error. A map of a trace: test_plan_trace.py."""

import csv
import math
import subprocess
import sys

import numpy as np
import pytest

from pdjax import config as config_lib
from pdjax.planning import placement_runs as plan_lib
from pdjax.runner import execute as run_lib
from pdjax.planning import map_mode, mixes
from pdjax.planning.map_search import Lattice, loosest_answer, map_placements, walk
from pdjax.planning.search import Placement
from pdjax.planning.slo_grid import RunRecord, cells, goodput, winner_of

INF = math.inf


def rec(rate, ttft, tpot, judged=None):
  n = len(ttft)
  return RunRecord(rate, np.array(ttft, float), np.array(tpot, float),
                   np.ones(n, bool) if judged is None else np.array(judged, bool))


def test_attainment_counts_like_the_summary():
  r = rec(4.0, [0.1, 0.3, INF, 0.2, 0.05], [0.02, 0.01, INF, 0.0, 0.5],
          judged=[True, True, True, True, False])      # the last one was cancelled
  assert r.attainment(0.25, 0.03) == 2 / 4             # 0.1/0.02 and 0.2/undefined TPOT
  assert r.attainment(1.0, 0.03) == 3 / 4
  assert r.attainment(1.0, 0.015) == 2 / 4
  assert r.attainment(0.01, 1.0) == 0.0
  assert rec(1.0, [], []).attainment(1, 1) == 0.0


# Ten requests per run. Colocated 8 chips: at 8 req/s every TTFT 0.1 s, TPOT 0.03 s; at 16 req/s
# TTFTs 0.1 x 8 and 0.9 x 2, TPOT 0.03. Chunked: 8 req/s TTFT 0.3 / TPOT 0.02; 16 req/s fails
# everything (TTFT 5). Disaggregated on 4 chips: 8 req/s TTFT 0.6 / TPOT 0.01; 16 req/s TTFT
# 0.6 x 9 + 3.0, TPOT 0.01. Colocated and disaggregated fail everything at 32 req/s (no first
# token): each cell's answer has a failing rate above it, a capacity (test_plan_unsaturated.py:
# a cell met at the highest rate a walk reached is a lower bound).
RUNS = [
    ("colocated", "8xTP1", 8, [rec(8, [0.1] * 10, [0.03] * 10),
                               rec(16, [0.1] * 8 + [0.9] * 2, [0.03] * 10),
                               rec(32, [INF] * 10, [INF] * 10)]),
    ("chunked", "8xTP1", 8, [rec(8, [0.3] * 10, [0.02] * 10), rec(16, [5.0] * 10, [0.02] * 10)]),
    ("disaggregated", "2xP + 2xD", 4, [rec(8, [0.6] * 10, [0.01] * 10),
                                       rec(16, [0.6] * 9 + [3.0], [0.01] * 10),
                                       rec(32, [INF] * 10, [INF] * 10)]),
]


def test_cells_by_hand():
  got = {(c.ttft_s, c.tpot_s): c for c in cells(RUNS, [0.2, 0.5, 1.0], [0.015, 0.025, 0.05],
                                                 target=0.9)}
  assert len(got) == 9
  # TTFT 0.2 / TPOT 0.05: colocated 8 req/s (16 has 80%): 1.0/chip; chunked none; disagg none.
  c = got[(0.2, 0.05)]
  assert (c.winner, c.ratio) == ("colocated", 0.0)
  assert c.best == {"colocated": (1.0, "8xTP1"), "chunked": (0.0, ""),
                    "disaggregated": (0.0, "")}
  # TTFT 0.5 / TPOT 0.025: colocated fails TPOT, chunked 8/8 = 1.0; disagg TTFT 0.6 fails.
  c = got[(0.5, 0.025)]
  assert (c.winner, c.ratio) == ("chunked", 0.0)
  # TTFT 1.0 / TPOT 0.05: colocated 16/8 = 2.0; disagg 16 (9 of 10 meet) / 4 = 4.0.
  c = got[(1.0, 0.05)]
  assert (c.winner, c.ratio) == ("disaggregated", 2.0)
  assert c.best["disaggregated"] == (4.0, "2xP + 2xD")
  # TPOT 0.015: only disaggregated meets it: 16 / 4 over nothing.
  c = got[(1.0, 0.015)]
  assert (c.winner, c.ratio) == ("disaggregated", INF)
  c = got[(0.2, 0.015)]
  assert c.winner == "none" and math.isnan(c.ratio)
  assert goodput(RUNS[0][3], 1.0, 0.05, 0.9) == 16
  assert goodput(RUNS[0][3], 0.2, 0.05, 0.9) == 8
  assert goodput(RUNS[1][3], 0.2, 0.05, 0.9) == 0.0


def test_a_growing_queue_is_not_goodput():
  # 150 requests in arrival order: thirds of 50. Middle-third median TTFT 0.1 s; the last third
  # 0.17 s is within 1.5 x 0.1 + 0.02 = 0.17 (stable), 0.18 s is not.
  def run(last_ttft, last_tpot=0.02):
    return rec(8, [0.1] * 100 + [last_ttft] * 50, [0.02] * 100 + [last_tpot] * 50)
  assert run(0.17).stable and not run(0.18).stable
  assert run(0.1, 0.032).stable and not run(0.1, 0.0325).stable   # 1.5 x 0.02 + 0.002
  assert run(0.05, 0.01).stable                                    # getting faster is fine
  assert not run(INF).stable
  assert run(0.18).attainment(1.0, 0.05) == 1.0
  assert not run(0.18).meets(1.0, 0.05, 0.9) and run(0.17).meets(1.0, 0.05, 0.9)
  assert goodput([rec(4, [0.1] * 150, [0.02] * 150), run(0.18)], 1.0, 0.05, 0.9) == 4
  assert rec(8, [0.1] * 99 + [9.0] * 50, [0.02] * 149).stable   # 149 requests: not judged


def test_winner_rules():
  assert winner_of({"colocated": 1.0, "chunked": 1.0, "disaggregated": 1.0}) == ("tie", 1.0)
  assert winner_of({"colocated": 1.0, "chunked": 1.0, "disaggregated": 0.5}) == ("colocated", 0.5)
  assert winner_of({"colocated": 1.0, "chunked": 2.0, "disaggregated": 1.0}) == ("chunked", 0.5)
  assert winner_of({"colocated": 0.0, "chunked": 0.0, "disaggregated": 3.0}) == (
      "disaggregated", INF)


def _capacity_eval(capacity, tried):
  """Request i of 10 has TTFT (i + 1) / 10 * rate / capacity, plus 0.1 s (none finishes past
  2 x capacity); TPOT 0.05."""
  def evaluate(rate):
    tried.append(rate)
    ttft = [0.1 + (i + 1) / 10 * rate / capacity if rate <= capacity * 2 else INF
            for i in range(10)]
    return rec(rate, ttft, [0.05] * 10)
  return evaluate


def test_walk_climbs_then_descends():
  lat = Lattice(1.0, 64.0, 2.0)
  assert (lat.k_max, lat.rate(3), lat.nearest(5.0), lat.nearest(100.0)) == (6, 8.0, 2, 6)
  slo = [(0.15, 0.1), (0.35, 0.1), (2.1, 0.1)]
  tried = []
  records = walk(_capacity_eval(8.0, tried), lat, 2, slo, 0.9)
  # Up from 4: 4, 8, 16 meet the loosest cell (TTFT <= 0.1 + 16 / 8 = 2.1 s), 32 fails it.
  # Down: 2 req/s meets TTFT 0.35 (0.1 + 2 / 8), which 4 did not, and improves 0.15 (1/10 ->
  # 2/10 of requests): go on; 1 req/s: 0.15 improves to 4/10: go on; no lower rate.
  assert tried == [4.0, 8.0, 16.0, 32.0, 2.0, 1.0]
  assert sorted(records) == [0, 1, 2, 3, 4, 5]
  assert loosest_answer(records, slo, 0.9) == 4
  tried = []
  walk(_capacity_eval(8.0, tried), lat, 6, slo, 0.9)   # starting too high: descend
  assert tried == [64.0, 32.0, 16.0, 8.0, 4.0, 2.0, 1.0]
  tried = []   # every cell met at 2 req/s: no need to go lower
  walk(_capacity_eval(8.0, tried), lat, 2, [(0.35, 0.1), (2.1, 0.1)], 0.9)
  assert tried == [4.0, 8.0, 16.0, 32.0, 2.0]
  tried = []   # TPOT 0.04 is out of reach: 2 req/s improves nothing over 4, stop there
  walk(_capacity_eval(8.0, tried), lat, 2, [(2.1, 0.04), (2.1, 0.1)], 0.9)
  assert tried == [4.0, 8.0, 16.0, 32.0, 2.0]


def test_walk_runs_no_rate_that_cannot_change_a_cell():
  # A cell's goodput is the highest rate meeting it: once some rate tried meets every cell, a
  # lower rate changes no answer. Here 4 req/s misses TTFT 0.35 (8 of 10) but 8 req/s meets it
  # (noise), so the descent below 4 has nothing to decide.
  lat = Lattice(1.0, 64.0, 2.0)
  ttft = {4.0: [0.3] * 8 + [0.5] * 2, 8.0: [0.3] * 10, 16.0: [1.0] * 10, 32.0: [INF] * 10}
  tried = []
  def evaluate(rate):
    tried.append(rate)
    return rec(rate, ttft.get(rate, [0.3] * 10), [0.05] * 10)
  records = walk(evaluate, lat, 2, [(0.35, 0.1), (2.1, 0.1)], 0.9)
  assert tried == [4.0, 8.0, 16.0, 32.0]
  assert goodput([records[k] for k in sorted(records)], 0.35, 0.1, 0.9) == 8.0


def test_map_placements():
  got = map_placements(8, (1, 2, 4), lambda t: True, lambda p: True, tp_count=2,
                       full_budget=True, max_disagg=4)
  assert [(p.run, p.describe()) for p in got] == [
      ("colocated", "8xTP1"), ("colocated", "4xTP2"), ("chunked", "8xTP1"), ("chunked", "4xTP2"),
      ("disaggregated", "1xP(tp1) + 7xD(tp1)"), ("disaggregated", "3xP(tp1) + 5xD(tp1)"),
      ("disaggregated", "5xP(tp1) + 3xD(tp1)"), ("disaggregated", "7xP(tp1) + 1xD(tp1)")]
  no_tp1 = map_placements(8, (1, 2, 4), lambda t: True,
                          lambda p: all(tp > 1 for _, _, tp in p.tiers), tp_count=2,
                          full_budget=True, max_disagg=0)
  assert [p.describe() for p in no_tp1 if p.run == "disaggregated"] == [
      "1xP(tp2) + 3xD(tp2)", "2xP(tp2) + 2xD(tp2)", "3xP(tp2) + 1xD(tp2)",
      "2xP(tp2) + 1xD(tp4)", "1xP(tp4) + 2xD(tp2)", "1xP(tp4) + 1xD(tp4)"]


def test_mixes_from_medians():
  assert mixes.MIXES["azure_conv"]["lognormal_prompt_mean"] == 1681.7     # 1020 * e^0.5
  assert mixes.MIXES["azure_code"]["lognormal_output_mean"] == 21.4       # 13 * e^0.5
  w = config_lib.load_config_module("configs/default.py").get_config().workload
  mixes.apply_mix(w, "sharegpt")
  assert (w.preset, w.lognormal_prompt_mean, w.lognormal_output_mean) == ("lognormal", 161, 338)
  with pytest.raises(KeyError):
    mixes.apply_mix(w, "nope")


def _tiny_map_config():
  cfg = config_lib.load_config_module("configs/default.py").get_config()
  cfg.backend, cfg.progress = "sim", False
  # The shapes this test's latencies were worked out on (the default experiment's documents
  # are longer since issue 24).
  cfg.kv.max_model_len, cfg.kv.pages_per_instance = 512, 256
  cfg.workload.doc_prompt_len = (192, 448)
  cfg.scheduler.prefill_buckets, cfg.scheduler.chunk_budget = (64, 128, 256, 512), 128
  cfg.sim.hardware = "tpu_v5e"
  cfg.plan.chip_budget, cfg.plan.tp_choices = 2, (1,)
  cfg.plan.num_requests, cfg.plan.min_duration_s = 30, 0.0
  cfg.plan.map = True
  cfg.plan.map_ttft_s, cfg.plan.map_tpot_s = (0.0004, 0.01), (0.00022, 0.01)
  cfg.plan.map_rate_min, cfg.plan.map_rate_max = 400.0, 1600.0   # lattice: 400, 1600 req/s/chip
  cfg.plan.map_rate_factor, cfg.plan.map_rate_start = 4.0, 400.0
  cfg.plan.workers = 1             # in-process (test_plan_map_pool.py: a pool)
  return cfg


def test_tiny_map_matches_the_planners_attainment(tmp_path):
  cfg = _tiny_map_config()
  map_mode.run_map(cfg, str(tmp_path))
  with open(tmp_path / "map.csv") as f:
    reader = csv.DictReader(f)
    rows = list(reader)
  assert reader.fieldnames == [
      "model", "hardware", "mix", "ttft_s", "tpot_s", "colocated_per_chip",
      "colocated_placement", "chunked_per_chip", "chunked_placement", "disaggregated_per_chip",
      "disaggregated_placement", "winner", "disagg_over_aggregated", "unsaturated"]
  assert [(r["model"], r["hardware"], r["mix"], r["ttft_s"], r["tpot_s"]) for r in rows] == [
      ("tiny", "tpu_v5e", "config", t, p) for t in ("0.0004", "0.01") for p in ("0.00022", "0.01")]
  with open(tmp_path / "runs.csv") as f:
    runs = list(csv.DictReader(f))
  assert {(r["run"], r["placement"]) for r in runs} == {
      ("colocated", "2xTP1"), ("chunked", "2xTP1"), ("disaggregated", "1xP(tp1) + 1xD(tp1)")}
  assert {r["rate_per_chip"] for r in runs} <= {"400.0", "1600.0"}
  # Per cell, each run's summary attainment with that SLO (pdjax.metrics' count).
  mcfg = config_lib.validate(cfg)
  for row in rows:
    slo_cfg = cfg.copy_and_resolve_references()
    slo_cfg.slo.ttft_s, slo_cfg.slo.tpot_s = float(row["ttft_s"]), float(row["tpot_s"])
    for kind in ("colocated", "chunked", "disaggregated"):
      best = 0.0
      for run in (r for r in runs if r["run"] == kind):
        placement = Placement(kind, (("colocated", 2, 1),)) if kind != "disaggregated" else \
            Placement(kind, (("prefill", 1, 1), ("decode", 1, 1)))
        rate = float(run["rate_rps"])
        run_cfg = plan_lib.placement_config(slo_cfg, mcfg, placement, rate)
        summary, _, _ = run_lib.execute(run_cfg, mcfg, kind, None, quiet=True)
        if summary["slo_attainment"] >= cfg.slo.attainment:
          best = max(best, rate / 2)
      assert float(row[f"{kind}_per_chip"]) == best, (row, kind)
  # 1600 req/s/chip is the lattice's top: a kind meeting a cell there found no failing rate, so
  # its number is a lower bound and the cell is unsaturated (it read "tie" 1.00 before).
  assert [(r["colocated_per_chip"], r["chunked_per_chip"], r["disaggregated_per_chip"],
           r["winner"], r["disagg_over_aggregated"], r["unsaturated"]) for r in rows] == [
      ("0.0", "0.0", "400.0", "disaggregated", "inf", ""),
      ("1600.0", "0.0", "1600.0", "unsaturated", "", "colocated;disaggregated"),
      ("0.0", "1600.0", "1600.0", "unsaturated", "", "chunked;disaggregated"),
      ("1600.0", "1600.0", "1600.0", "unsaturated", "", "colocated;chunked;disaggregated")]
  assert (tmp_path / "plots" / "map_tiny_tpu_v5e.png").stat().st_size > 0
  md = (tmp_path / "map.md").read_text()
  for line in ("- backend: sim (roofline cost model, tpu_v5e)",
               "- model: tiny (preset, ", "- seed: 0",
               "- workload mixes: config = synthetic mixed, poisson arrivals; at the lattice's",
               "- SLO grid: TTFT 0.0004, 0.01 s x TPOT 0.22, 10 ms, target 90% attainment",
               "config lengths (tokens, of 1000 draws): prompt p50 "):
    assert "\n" + line in md, line
  # Re-evaluating the saved runs gives the same cells without simulating.
  again = tmp_path / "again"
  cfg.plan.map_runs = str(tmp_path)
  map_mode.run_map(cfg, str(again))
  assert (again / "map.csv").read_text() == (tmp_path / "map.csv").read_text()


def test_bad_map_config_is_one_line():
  proc = subprocess.run([sys.executable, "-m", "pdjax.plan", "--config.plan.map=True",
                         "--config.plan.map_mixes=sharegpt,nope"],
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2
  assert proc.stderr.strip() == (
      "config error: plan.map_mixes: unknown mix 'nope' (known: sharegpt, long_prompt, "
      "azure_conv, azure_code, config, workload)")


@pytest.mark.parametrize("key,value,message", [
    ("map_mixes", "sharegpt", "plan.map_mixes: mix 'sharegpt' draws up to 2048 tokens > "
                              "kv.max_model_len=1856"),
    ("map_tpot_s", (), "plan.map_tpot_s=() must be a non-empty tuple of seconds > 0"),
    ("map_runs", "/nonexistent", "plan.map_runs='/nonexistent' holds no runs.csv + runs.npz of a "
                                 "map"),
    ("map_rate_factor", 1.0, "plan.map_rate_min=0.0625 <= plan.map_rate_start=1.0 <= "
                             "plan.map_rate_max=64.0 (> 0) and plan.map_rate_factor=1.0 > 1 "
                             "required"),
])
def test_map_settings_errors(key, value, message):
  cfg = config_lib.load_config_module("configs/default.py").get_config()
  cfg.plan[key] = value
  with pytest.raises(config_lib.ConfigError) as e:
    map_mode.settings(cfg)
  assert str(e.value) == message
