"""The map's hybrid kind (plan.map_hybrid): isl_bounding and slo_headroom scored beside the
three kinds, slo_headroom's runs answering their own SLO cell only, its lattice steps against
the best of the rest; by hand, then a tiny map end to end (its runs re-run by hand)."""

import collections
import csv
import math

import numpy as np
import pytest

from pdjax import config as config_lib
from pdjax.planning import map_mode, map_output
from pdjax.planning import placement_runs as plan_lib
from pdjax.planning.search import Placement
from pdjax.planning.slo_grid import RunRecord, cells, lattice_steps
from pdjax.runner.execute import execute
from test_plan_map import _tiny_map_config

INF = math.inf


def rec(rate, ttft, tpot):
  return RunRecord(rate, np.full(10, ttft, float), np.full(10, tpot, float), np.ones(10, bool))


# Four chips each; a cell's per-chip goodput is the rate / 4. Lattice factor 2. Every walk ends
# at a rate failing every cell (TTFT 5 s), so each answer is a capacity, not a lower bound
# (test_plan_unsaturated.py).
RUNS = [
    ("colocated", "4xTP1", 4, [rec(8, 0.1, 0.03), rec(16, 0.5, 0.03), rec(32, 5.0, 0.03)],
     None),
    ("chunked", "4xTP1", 4, [], None),
    ("disaggregated", "2xP + 2xD", 4, [rec(8, 0.3, 0.015), rec(16, 5.0, 0.015)], None),
    ("isl_bounding", "2xP + 2xD isl", 4,
     [rec(8, 0.3, 0.015), rec(16, 0.3, 0.015), rec(32, 5.0, 0.015)], None),
    ("slo_headroom", "2xP + 2xD slo", 4, [rec(4, 0.1, 0.015), rec(8, 5.0, 0.015)], (0.2, 0.02)),
    # meets (1.0, 0.05) too, at 16 / 4 = 4, but it ran for (0.2, 0.05) only
    ("slo_headroom", "2xP + 2xD slo", 4, [rec(16, 0.1, 0.03), rec(32, 5.0, 0.03)], (0.2, 0.05)),
    ("slo_headroom", "2xP + 2xD slo", 4, [rec(4, 0.3, 0.015), rec(8, 5.0, 0.015)], (1.0, 0.02)),
    ("slo_headroom", "2xP + 2xD slo", 4, [rec(32, 5.0, 0.03)], (1.0, 0.05)),
]


def test_hybrid_cells_by_hand():
  got = {(c.ttft_s, c.tpot_s): c for c in cells(RUNS, [0.2, 1.0], [0.02, 0.05], 0.9, factor=2.0)}
  # (0.2, 0.02): nothing but slo_headroom meets it (4 / 4 = 1.0 per chip).
  c = got[(0.2, 0.02)]
  assert c.best["slo_headroom"] == (1.0, "2xP + 2xD slo") and c.steps == INF
  assert c.winner == "none"
  # (0.2, 0.05): colocated 8 / 4 = 2; slo_headroom 16 / 4 = 4: one step of 2 ahead.
  c = got[(0.2, 0.05)]
  assert (c.best["colocated"][0], c.best["slo_headroom"][0], c.steps) == (2.0, 4.0, 1.0)
  # (1.0, 0.02): isl_bounding 16 / 4 = 4 against slo_headroom's 1: two steps behind; the
  # winner is still disaggregated vs aggregated (disaggregated 2, aggregated none).
  c = got[(1.0, 0.02)]
  assert c.best["isl_bounding"] == (4.0, "2xP + 2xD isl")
  assert (c.steps, c.winner, c.ratio) == (-2.0, "disaggregated", INF)
  # (1.0, 0.05): its own slo_headroom run fails (TTFT 5 s); the (0.2, 0.05) run that would
  # meet it does not count here.
  c = got[(1.0, 0.05)]
  assert (c.best["slo_headroom"], c.best["colocated"][0], c.steps) == ((0.0, ""), 4.0, -INF)
  assert map_output.hybrid_line(list(got.values())) == (
      "slo_headroom vs the best of colocated, chunked, disaggregated, isl_bounding (rate "
      "lattice steps): within one step in 2/4 cells, ahead by >= 1 step in 2 (50%); behind by "
      "more than one in 2 (worst -inf at TTFT 1 s / TPOT 50 ms)")
  row = map_output.cell_row("m", "h", "x", got[(1.0, 0.02)])
  assert (row["isl_bounding_per_chip"], row["slo_headroom_per_chip"],
          row["slo_headroom_steps"]) == (4.0, 1.0, "-2")
  # Without hybrid runs a cell has neither the kinds nor steps.
  plain = cells(RUNS[:3], [0.2], [0.05], 0.9, factor=2.0)[0]
  assert set(plain.best) == {"colocated", "chunked", "disaggregated"} and plain.steps is None
  assert map_output.hybrid_line([plain]) is None


def test_lattice_steps():
  assert lattice_steps(4.0, 4.0, 2.0) == 0.0
  assert lattice_steps(0.0, 0.0, 2.0) == 0.0
  assert lattice_steps(2.83, 2.0, 2 ** 0.5) == 1.0
  assert lattice_steps(1.0, 0.0, 2.0) == INF and lattice_steps(0.0, 1.0, 2.0) == -INF


def test_hybrid_placement_runs_disaggregated_with_its_path():
  cfg = config_lib.load_config_module("configs/default.py").get_config()
  cfg.backend = "sim"
  mcfg = config_lib.validate(cfg)
  pl = Placement("hybrid", (("prefill", 1, 2), ("decode", 3, 2)), "slo_headroom")
  assert (pl.mode, pl.chips, pl.describe()) == ("disaggregated", 8,
                                                "1xP(tp2) + 3xD(tp2) slo_headroom")
  run = plan_lib.placement_config(cfg, mcfg, pl, 4.0)
  assert (run.mode, run.scheduler.path, run.cluster.prefill.instances,
          run.cluster.decode.instances) == ("disaggregated", "slo_headroom", 1, 3)


def test_map_hybrid_names_are_checked():
  cfg = config_lib.load_config_module("configs/default.py").get_config()
  cfg.plan.map_hybrid = "isl_bounding,slo"
  with pytest.raises(config_lib.ConfigError) as e:
    map_mode.settings(cfg)
  assert str(e.value) == ("plan.map_hybrid: unknown path policy 'slo' (known: isl_bounding, "
                          "slo_headroom)")


def _tiny_hybrid_config():
  cfg = _tiny_map_config()
  cfg.plan.map_hybrid = "isl_bounding,slo_headroom"
  return cfg


CELLS = [(0.0004, 0.00022), (0.0004, 0.01), (0.01, 0.00022), (0.01, 0.01)]


def test_tiny_hybrid_map(tmp_path):
  cfg = _tiny_hybrid_config()
  summary = map_mode.run_map(cfg, str(tmp_path))
  # Every kind meets the three loose cells at 1600 req/s/chip, the lattice's top: lower
  # bounds, so their steps are not judged (they read +0 / inf, cap against cap, before issue
  # 47); the tightest cell saturates (400 req/s/chip at best) and is judged.
  assert ("tiny tpu_v5e config: slo_headroom vs the best of colocated, chunked, disaggregated, "
          "isl_bounding (rate lattice steps): within one step in 1/1 cells, ahead by >= 1 step "
          "in 0 (0%); unsaturated (not judged: a lower bound) 3") in summary.splitlines()
  with open(tmp_path / "map.csv") as f:
    reader = csv.DictReader(f)
    rows = list(reader)
  assert reader.fieldnames[-5:] == ["isl_bounding_per_chip", "isl_bounding_placement",
                                    "slo_headroom_per_chip", "slo_headroom_placement",
                                    "slo_headroom_steps"]
  with open(tmp_path / "runs.csv") as f:
    runs = list(csv.DictReader(f))
  isl = [r for r in runs if r["path"] == "isl_bounding"]
  assert {(r["run"], r["placement"], r["cell_ttft_s"]) for r in isl} == {
      ("hybrid", "1xP(tp1) + 1xD(tp1) isl_bounding", "")}
  slo = [r for r in runs if r["path"] == "slo_headroom"]
  assert sorted({(float(r["cell_ttft_s"]), float(r["cell_tpot_s"])) for r in slo}) == CELLS
  # Each slo_headroom run, re-run by hand with its cell's SLO: the same attainment there,
  # and the SLO steers the paths (exact counts at 1600 req/s/chip).
  mcfg = config_lib.validate(cfg)
  pl = Placement("hybrid", (("prefill", 1, 1), ("decode", 1, 1)), "slo_headroom")
  paths = {}
  for r in slo:
    cell = (float(r["cell_ttft_s"]), float(r["cell_tpot_s"]))
    c = cfg.copy_and_resolve_references()
    c.slo.ttft_s, c.slo.tpot_s = cell
    summary, result, _ = execute(plan_lib.placement_config(c, mcfg, pl, float(r["rate_rps"])),
                                 mcfg, "disaggregated", None, quiet=True)
    assert round(summary["slo_attainment"], 4) == float(r["attainment_loosest"]), r
    if r["rate_per_chip"] == "1600.0":
      paths[cell] = collections.Counter(q.path for q in result.requests)
  assert paths == {(0.0004, 0.00022): {"disaggregated": 29, "colocated": 1},
                   (0.0004, 0.01): {"disaggregated": 23, "colocated": 7},
                   (0.01, 0.00022): {"disaggregated": 29, "colocated": 1},
                   (0.01, 0.01): {"disaggregated": 21, "colocated": 9}}
  assert [(r["isl_bounding_per_chip"], r["slo_headroom_per_chip"], r["slo_headroom_steps"])
          for r in rows] == [("400.0", "400.0", "+0"), ("1600.0", "1600.0", "unsaturated"),
                             ("1600.0", "1600.0", "unsaturated"),
                             ("1600.0", "1600.0", "unsaturated")]
  md = (tmp_path / "map.md").read_text()
  assert "\n- hybrid (not in the winner): disaggregated splits whose decode instances" in md
  assert "\n| 10 ms | U | U |\n| 0.22 ms | +0 | U |\n" in md
  again = tmp_path / "again"
  cfg.plan.map_runs = str(tmp_path)
  map_mode.run_map(cfg, str(again))
  assert (again / "map.csv").read_text() == (tmp_path / "map.csv").read_text()


def test_headroom_walks_take_the_cells_best_split_and_the_fewest_prefill_chips():
  from pdjax.planning import map_hybrid
  from pdjax.planning.map_search import Lattice
  cfg = _tiny_map_config()
  few = Placement("disaggregated", (("prefill", 1, 1), ("decode", 3, 1)))
  even = Placement("disaggregated", (("prefill", 2, 1), ("decode", 2, 1)))
  # colocated meets both cells at 8 req/s (2 per chip); "even" meets the loose one at 16
  entries = [("colocated", "4xTP1", 4, [rec(8, 0.1, 0.03)], None),
             ("disaggregated", even.describe(), 4, [rec(16, 0.3, 0.03)], None)]
  s = map_mode.MapSettings(["tiny"], ["h100"], ["config"], [0.2, 1.0], [0.05],
                           Lattice(1.0, 16.0, 2.0), 1.0, ["slo_headroom"])
  tasks = map_hybrid.headroom_tasks(cfg, s, {"k": entries}, {"k": (cfg, None, None,
                                                                    [few, even])})
  got = [(t.cell, t.placement.describe(), t.start, t.cfg.slo.ttft_s, t.cfg.slo.tpot_s)
         for t in tasks]
  assert got == [((0.2, 0.05), "1xP(tp1) + 3xD(tp1) slo_headroom", 1, 0.2, 0.05),
                 ((1.0, 0.05), "2xP(tp1) + 2xD(tp1) slo_headroom", 2, 1.0, 0.05),
                 ((1.0, 0.05), "1xP(tp1) + 3xD(tp1) slo_headroom", 2, 1.0, 0.05)]


@pytest.mark.parametrize("local_prefill", ["whole", "chunked"])
def test_local_prefill_on_the_decode_tier(local_prefill):
  """length_hybrid keeps every prompt under 10,000 tokens on the decode instance: whole, a
  prompt runs as prefill steps of up to its length there; chunked, as mixed steps of at most
  chunk_budget (128) tokens beside the decode rows (with the decode rows: num_tokens counts
  them too). Every request finishes, no page leaks."""
  from pdjax.runner import serve_requests
  cfg = _tiny_map_config()
  cfg.scheduler.local_prefill, cfg.scheduler.length_threshold = local_prefill, 10000
  mcfg = config_lib.validate(cfg)
  pl = Placement("hybrid", (("prefill", 1, 1), ("decode", 1, 1)), "length_hybrid")
  _, result, instances = execute(plan_lib.placement_config(cfg, mcfg, pl, 800.0), mcfg,
                                 "disaggregated", None, quiet=True, summarize=False)
  assert {r.status.value for r in result.requests} == {"finished"}
  assert serve_requests.kv_pages_leaked(result.instances or instances) == 0
  assert {r.path for r in result.requests} == {"colocated"}
  assert max(r.prompt_len for r in result.requests) > 128
  on_decode = [s for s in result.steps if s["role"] == "decode" and s["kind"] != "decode"]
  kinds = {s["kind"] for s in on_decode}
  if local_prefill == "chunked":
    # (a chunk with no decode running is a "prefill" step, still of <= 128 tokens)
    assert "mixed" in kinds and max(s["num_tokens"] for s in on_decode) <= 128
  else:
    assert "prefill" in kinds and max(s["num_tokens"] for s in on_decode) > 128
