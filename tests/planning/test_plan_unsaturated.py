"""Answers that are lower bounds, not results (issue 47, items 7 and 9).

Map mode: a cell that some kind meets at the highest rate its walk reached (the lattice's top,
or the highest rate whose run fits plan.max_requests_per_run), with no failing rate above, has
a lower bound for that kind, not a goodput: the cell is "unsaturated", never a win or a tie.

The plain planner: a rate whose run would need more than plan.max_requests_per_run requests
(max(plan.num_requests, rate x plan.min_duration_s)) is not run; the search stops there,
unsaturated, and says so. The `tiny` preset on h200 passes every rate, so before the bound its
search climbed toward rate_hi x 2^12 with 60 s of arrivals per rate and never answered.
"""

import csv
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from pdjax import config as config_lib
from pdjax.planning import map_output
from pdjax.planning.placement_runs import check_plan
from pdjax.planning.search import max_rate
from pdjax.planning.slo_grid import RunRecord, cells

INF = math.inf


def rec(rate, ttft, tpot):
  return RunRecord(rate, np.full(10, ttft, float), np.full(10, tpot, float), np.ones(10, bool))


# Four chips each (per-chip goodput = rate / 4); every walk reached 16 req/s, the lattice's top.
# Colocated meets every loose cell at 16, disaggregated meets TTFT 1 s at 16: no failing rate
# above either, so their answers there are lower bounds. Chunked fails at 16 (TTFT 5 s).
RUNS = [
    ("colocated", "4xTP1", 4, [rec(8, 0.1, 0.02), rec(16, 0.1, 0.02)]),
    ("chunked", "4xTP1", 4, [rec(8, 0.1, 0.02), rec(16, 5.0, 0.02)]),
    ("disaggregated", "2xP + 2xD", 4, [rec(8, 0.1, 0.005), rec(16, 0.6, 0.005)]),
]


def test_a_cell_met_at_the_highest_rate_reached_is_unsaturated():
  got = {(c.ttft_s, c.tpot_s): c for c in cells(RUNS, [0.2, 1.0], [0.01, 0.05], 0.9)}
  # TTFT 1 s / TPOT 50 ms: colocated and disaggregated both at 16 / 4 = 4 per chip, the cap:
  # it read "tie" before; neither number is a capacity.
  c = got[(1.0, 0.05)]
  assert c.winner == "unsaturated" and math.isnan(c.ratio)
  assert c.unsaturated == ("colocated", "disaggregated")
  assert c.best["colocated"] == (4.0, "4xTP1") and c.best["chunked"] == (2.0, "4xTP1")
  # TTFT 0.2 s / TPOT 50 ms: colocated's 4 is a lower bound (disaggregated fails at 16, 2 is
  # its goodput): it read "colocated" 0.50 before.
  c = got[(0.2, 0.05)]
  assert c.winner == "unsaturated" and c.unsaturated == ("colocated",)
  # TPOT 10 ms: only disaggregated meets it; at TTFT 0.2 s 16 req/s fails it (TTFT 0.6 s), so
  # its 2 per chip is a goodput and the win stands; at TTFT 1 s it is met at 16: unsaturated.
  c = got[(0.2, 0.01)]
  assert (c.winner, c.ratio, c.unsaturated) == ("disaggregated", INF, ())
  c = got[(1.0, 0.01)]
  assert (c.winner, c.unsaturated) == ("unsaturated", ("disaggregated",))
  cs = list(got.values())
  assert map_output.summary_lines(cs) == (
      "cells won: disaggregated 1; disaggregated's best margin infx at TTFT 0.2 s / TPOT 10 ms; "
      "unsaturated (not judged: a lower bound) 3")
  assert map_output.text_diagram(cs, [0.2, 1.0], [0.01, 0.05]) == [
      "| TPOT \\ TTFT | 0.2 s | 1 s |", "|---|---|---|",
      "| 50 ms | U | U |", "| 10 ms | D inf | U |"]
  row = map_output.cell_row("m", "h", "x", got[(1.0, 0.05)])
  assert (row["winner"], row["disagg_over_aggregated"], row["unsaturated"]) == (
      "unsaturated", "", "colocated;disaggregated")
  assert map_output.cell_row("m", "h", "x", got[(0.2, 0.01)])["unsaturated"] == ""
  assert map_output.COLUMNS[-1] == "unsaturated"


def test_a_hybrid_lower_bound_is_not_counted_in_steps():
  # slo_headroom meets its cell at the top of its walk: its steps against the rest are unknown.
  runs = RUNS + [("slo_headroom", "2xP + 2xD slo", 4, [rec(8, 0.1, 0.005)], (0.2, 0.01))]
  got = {(c.ttft_s, c.tpot_s): c for c in cells(runs, [0.2], [0.01], 0.9, factor=2.0)}
  c = got[(0.2, 0.01)]
  assert math.isnan(c.steps)      # it read 0 (within one step) before
  assert c.unsaturated == ("slo_headroom",) and c.winner == "disaggregated"
  assert map_output.fmt_steps(c.steps) == "unsaturated"
  assert map_output.hybrid_line([c]) == (
      "slo_headroom vs the best of colocated, chunked, disaggregated (rate lattice steps): "
      "no cell judged; unsaturated (not judged: a lower bound) 1")


class Rec:
  def __init__(self, rate, ok):
    self.rate, self.ok = rate, ok


def test_a_rate_beyond_the_bound_is_not_reached():
  seen = []
  def evaluate(rate):
    seen.append(rate)
    return Rec(rate, True)
  found = max_rate(evaluate, lambda r: r.ok, lo=1.0, hi=4.0, rel_tol=0.05,
                   reachable=lambda rate: rate <= 10.0)
  assert seen == [1.0, 4.0, 8.0]              # 16 req/s is beyond the bound: not run
  assert (found.rate, found.saturated, found.not_reached) == (8.0, False, 16.0)
  # A failing rate within the bound: the bound changes nothing.
  found = max_rate(lambda r: Rec(r, r <= 6.0), lambda r: r.ok, lo=1.0, hi=4.0, rel_tol=0.05,
                   reachable=lambda rate: rate <= 10.0)
  assert found.saturated and found.not_reached is None and 6.0 * 0.95 <= found.rate <= 6.0


def _plan(**values):
  p = config_lib.load_config_module("configs/default.py").get_config().plan
  for key, value in values.items():
    p[key] = value
  return p


def test_the_bound_is_checked():
  assert _plan().max_requests_per_run == 10000
  check_plan(_plan(max_requests_per_run=0))                # 0: no bound
  for values, message in (
      ({"max_requests_per_run": 200},
       "plan.max_requests_per_run=200 must be 0 (no bound) or >= plan.num_requests=300"),
      ({"max_requests_per_run": -1},
       "plan.max_requests_per_run=-1 must be 0 (no bound) or >= plan.num_requests=300"),
      ({"min_duration_s": 60.0, "rate_lo": 200.0, "rate_hi": 400.0},
       "plan.rate_lo=200 req/s needs 12000 requests (>= 60 s of arrivals) > "
       "plan.max_requests_per_run=10000: lower plan.rate_lo or plan.min_duration_s")):
    with pytest.raises(config_lib.ConfigError) as e:
      check_plan(_plan(**values))
    assert str(e.value) == message
  # Map mode: the lattice's lowest rate on the whole budget must fit.
  from pdjax.planning import map_mode
  cfg = config_lib.load_config_module("configs/default.py").get_config()
  cfg.plan.min_duration_s, cfg.plan.map_rate_min, cfg.plan.map_rate_start = 100.0, 16.0, 16.0
  with pytest.raises(config_lib.ConfigError) as e:
    map_mode.settings(cfg)
  assert str(e.value) == ("plan.map_rate_min=16 req/s per chip on 8 chips needs 12800 requests "
                          "> plan.max_requests_per_run=10000: lower plan.map_rate_min or "
                          "plan.min_duration_s")


# The command issue 47 reports (the planner's default config, plan_default.py: rates from 16 to
# 48 req/s, >= 60 s of arrivals each), which ran 11 minutes without an answer.
COMMAND = [sys.executable, "-m", "pdjax.plan", "--config.model.preset=tiny",
           "--config.sim.hardware=h200", "--config.plan.chip_budget=2",
           "--config.plan.tp_choices=(1,)"]
REASON = ("not reached: 192 req/s would need 11520 requests > plan.max_requests_per_run=10000 "
          "(every rate up to 96 req/s passed): raise plan.max_requests_per_run or lower "
          "plan.min_duration_s")


@pytest.mark.slow
def test_the_planner_answers_within_its_bound(tmp_path):
  t0 = time.time()
  proc = subprocess.Popen([*COMMAND, f"--workdir={tmp_path}"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True)
  try:
    proc.stdout, proc.stderr = proc.communicate(timeout=120)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)       # the planner and its pool's workers
    proc.communicate()
    raise
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert time.time() - t0 < 120
  with open(tmp_path / "plan.csv") as f:
    rows = list(csv.DictReader(f))
  assert [(r["rank"], r["run"], r["goodput_rps"], r["saturated"], r["rates_tried"])
          for r in rows] == [("", "colocated", "", "false", "3"), ("", "chunked", "", "false", "3"),
                             ("", "disaggregated", "", "false", "3")]
  assert f"- 3 of 3 placements have no goodput: {REASON}" in proc.stdout.splitlines()
  assert f"- 3 of 3 placements have no goodput: {REASON}\n" in (tmp_path / "plan.md").read_text()
  assert (f"[1/3] colocated 2xTP1: not reached: 192 req/s would need 11520 requests > "
          f"plan.max_requests_per_run=10000") in proc.stderr.splitlines()


def test_a_map_walk_stops_at_the_bound(monkeypatch):
  """Map mode: a placement that meets every cell climbs the lattice (1, 2, 4, ... 64 req/s per
  chip on 2 chips); with >= 10 s of arrivals per rate and at most 500 requests a run, 16 per
  chip (32 req/s, 320 requests) is the last rate run, 32 per chip (640 requests) is not
  reached, and every cell met there is unsaturated."""
  from pdjax.planning import map_walks, placement_runs
  from pdjax.planning.map_search import Lattice
  from pdjax.planning.search import Placement
  cfg = config_lib.load_config_module("configs/default.py").get_config()
  cfg.plan.num_requests, cfg.plan.min_duration_s, cfg.plan.max_requests_per_run = 10, 10.0, 500
  ran = []
  def evaluate(c, mcfg, pl, rate, trace=None):
    ran.append(rate)
    return rec(rate, 0.1, 0.01)
  monkeypatch.setattr(placement_runs, "evaluate", evaluate)
  pl = Placement("colocated", (("colocated", 2, 1),))
  slo = [(1.0, 0.05)]
  task = map_walks.WalkTask(("m", "h", "x"), cfg, None, None, pl, Lattice(1.0, 64.0, 2.0), 0,
                            slo, 0.9)
  runs, records = map_walks.run_walk(task)
  assert ran == [2.0, 4.0, 8.0, 16.0, 32.0]           # total rates: 1 .. 16 per chip
  c = cells([("colocated", pl.describe(), 2, [records[k] for k in sorted(records)])],
            [1.0], [0.05], 0.9)[0]
  assert (c.best["colocated"][0], c.winner, c.unsaturated) == (16.0, "unsaturated",
                                                                ("colocated",))
