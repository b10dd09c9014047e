"""Answers that are lower bounds, not results (issue 47, items 7 and 9).

Map mode: a cell that some kind meets at the highest rate its walk reached (the lattice's top,
or the highest rate whose run fits plan.max_requests_per_run), with no failing rate above, has
a lower bound for that kind, not a goodput: the cell is "unsaturated", never a win or a tie.
"""

import math

import numpy as np

from pdjax.planning import map_output
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
