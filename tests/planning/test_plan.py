"""The capacity planner: placement enumeration, the rate search and what it calls saturated,
the optimum of a toy cost model computed by hand, memory sizing, and the CLI end to end on the
simulator: the old default (`tiny` on h200) ranks nothing and says why."""

import csv
import dataclasses
import subprocess
import sys

import numpy as np
import pytest

from pdjax import config as config_lib
from pdjax.planning import placement_runs as plan_lib
from pdjax.models.llama_config import LlamaConfig
from pdjax.planning import capacity
from pdjax.planning.search import Placement, best_by_run, max_rate, placements, search
from pdjax.planning.slo_grid import RunRecord, cells, goodput
from pdjax.sim.hardware import Hardware


@dataclasses.dataclass
class Rec:        # what the search needs of a record: its rate (and here, the verdict)
  rate: float
  ok: bool


def passes(rec):
  return rec.ok


def test_placements_within_budget():
  got = placements(4, (1, 2), lambda tp: True)
  desc = [(p.run, p.tiers) for p in got]
  assert desc[:4] == [("colocated", (("colocated", 4, 1),)), ("colocated", (("colocated", 2, 2),)),
                      ("chunked", (("colocated", 4, 1),)), ("chunked", (("colocated", 2, 2),))]
  disagg = {tuple((n, tp) for _, n, tp in p.tiers) for p in got if p.run == "disaggregated"}
  assert disagg == {((1, 1), (1, 1)), ((1, 1), (2, 1)), ((1, 1), (3, 1)), ((2, 1), (1, 1)),
                    ((2, 1), (2, 1)), ((3, 1), (1, 1)), ((1, 1), (1, 2)), ((2, 1), (1, 2)),
                    ((1, 2), (1, 1)), ((1, 2), (2, 1)), ((1, 2), (1, 2))}
  assert all(p.chips <= 4 for p in got)
  assert [p.run for p in placements(4, (1, 2, 3), lambda tp: tp != 3)].count("colocated") == 2


def test_max_rate_doubles_then_bisects():
  seen = []
  def evaluate(rate):
    seen.append(rate)
    return Rec(rate, rate <= 13.3)
  found = max_rate(evaluate, passes, lo=1.0, hi=4.0, rel_tol=0.05)
  assert seen[:4] == [1.0, 4.0, 8.0, 16.0]           # widen while hi passes
  assert 13.3 * 0.95 <= found.rate <= 13.3 and found.saturated
  assert found.points == sorted(found.points)
  lo_fails = max_rate(lambda r: Rec(r, False), passes, lo=1.0, hi=4.0, rel_tol=0.05)
  assert (lo_fails.rate, lo_fails.points, lo_fails.saturated) == (None, [(1.0, False)], True)


def test_max_rate_runs_only_rates_that_can_change_its_answer():
  # Each rate halves the interval the answer can lie in, or stops the search: lo fails (no
  # goodput), or the interval is within rel_tol. 13.5 - 13 = 0.5 <= 0.05 x 13.5: stop.
  found = max_rate(lambda r: Rec(r, r <= 13.3), passes, lo=1.0, hi=4.0, rel_tol=0.05)
  assert found.tried == [1.0, 4.0, 8.0, 16.0, 12.0, 14.0, 13.0, 13.5]
  assert (found.rate, found.saturated) == (13.0, True)
  assert max_rate(lambda r: Rec(r, False), passes, lo=1.0, hi=4.0, rel_tol=0.05).tried == [1.0]


def test_a_search_that_never_fails_is_not_saturated():
  found = max_rate(lambda r: Rec(r, True), passes, lo=1.0, hi=4.0, rel_tol=0.05,
                   max_doublings=3)
  assert found.points == [(1.0, True), (4.0, True), (8.0, True), (16.0, True), (32.0, True)]
  assert (found.rate, found.saturated) == (32.0, False)
  # In a ranking: the capped rows get no goodput, no rank and no ratio; the others rank.
  cands = [Placement("colocated", (("colocated", 2, 1),)),
           Placement("disaggregated", (("prefill", 1, 1), ("decode", 1, 1))),
           Placement("chunked", (("colocated", 2, 1),))]
  cap = {"colocated": 1e9, "disaggregated": 6.0, "chunked": 1e9}
  rows = search(cands, lambda p, r: Rec(r, r <= cap[p.run]), passes, lo=1.0, hi=4.0,
                rel_tol=0.05, max_doublings=3)
  assert [(r.placement.run, r.search.saturated) for r in rows] == [
      ("disaggregated", True), ("colocated", False), ("chunked", False)]
  assert [r.rate for r in rows][1:] == [None, None] and rows[0].rate == rows[0].search.rate
  assert 6.0 * 0.95 <= rows[0].rate <= 6.0
  assert list(best_by_run(rows)) == ["disaggregated"]


def _record(rate, last_ttft):
  """150 requests: TTFT 0.1 s, the last third `last_ttft` (0.5 s: a queue that grows, with
  every request still within a 1 s TTFT target)."""
  return RunRecord(rate, np.array([0.1] * 100 + [last_ttft] * 50), np.full(150, 0.02),
                   np.ones(150, bool))


def test_the_search_does_not_count_a_growing_queue():
  # Attainment is 1.0 at every rate; from 12 req/s up the latencies grow over the run.
  def evaluate(rate):
    return _record(rate, 0.1 if rate < 12 else 0.5)
  meets = lambda rec: rec.meets(1.0, 0.1, 0.9)
  assert all(evaluate(r).attainment(1.0, 0.1) == 1.0 for r in (4, 16, 64))
  found = max_rate(evaluate, meets, lo=1.0, hi=4.0, rel_tol=0.05)
  assert 12 * 0.95 <= found.rate < 12 and found.saturated


# A toy cost model: each chip of a tier serves a fixed rate (prefill chips: 1.0 req/s at TP1,
# 0.8 at TP2; decode chips: 0.5 at TP1, 0.85 at TP2); a disaggregated placement serves
# min(prefill capacity, decode capacity), colocated 0.4 and chunked 0.41 per chip. By hand, on
# 4 chips the best is 2 x P(tp1) + 1 x D(tp2): min(2 * 1.0, 2 * 0.85) / 4 = 0.425 per chip
# (next: P(tp2) + D(tp2): min(1.6, 1.7) / 4 = 0.4; colocated 0.4; chunked 0.41).
PREFILL = {1: 1.0, 2: 0.8}
DECODE = {1: 0.5, 2: 0.85}


def _capacity(p: Placement) -> float:
  if p.run != "disaggregated":
    return p.chips * (0.4 if p.run == "colocated" else 0.41)
  (_, n_p, tp_p), (_, n_d, tp_d) = p.tiers
  return min(n_p * tp_p * PREFILL[tp_p], n_d * tp_d * DECODE[tp_d])


def test_planner_finds_the_hand_computed_optimum():
  rows = search(placements(4, (1, 2), lambda tp: True),
                lambda p, rate: Rec(rate, rate <= _capacity(p)), passes,
                lo=0.1, hi=0.2, rel_tol=0.01)
  best = rows[0]
  assert best.placement == Placement("disaggregated", (("prefill", 2, 1), ("decode", 1, 2)))
  assert 1.7 * 0.99 <= best.rate <= 1.7
  assert best.per_chip == pytest.approx(0.425, rel=0.01)
  by_run = best_by_run(rows)
  assert by_run["colocated"].per_chip == pytest.approx(0.4, rel=0.01)
  assert by_run["chunked"].per_chip == pytest.approx(0.41, rel=0.01)
  assert rows[1].per_chip < best.per_chip


def test_kv_pages_from_memory_by_hand():
  cfg = LlamaConfig(vocab_size=1000, hidden_size=100, intermediate_size=200, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=25)
  chip = Hardware("test", 1e12, hbm_bytes=2e6, hbm_bytes_per_s=1e9, link_bytes_per_s=1e8)
  # weights (280_000 + 100_000) * 2 = 760_000 bytes; KV 400 bytes/token, 1600 per 4-token page.
  assert capacity.kv_pages(cfg, chip, 1, page_size=4, dtype_bytes=2, mem_util=0.5) == 150
  assert capacity.kv_pages(cfg, chip, 2, page_size=4, dtype_bytes=2, mem_util=0.5) == 775
  assert capacity.kv_pages(cfg, chip, 1, page_size=4, dtype_bytes=2, mem_util=0.3) < 0
  # Pools are capped at 2 x batch x pages per sequence (10 pages of 4 tokens for 40 tokens).
  kw = dict(page_size=4, dtype_bytes=2, mem_util=0.5, max_model_len=40)
  assert capacity.pool_pages(cfg, chip, 1, max_batch=100, **kw) == 150
  assert capacity.pool_pages(cfg, chip, 2, max_batch=4, **kw) == 80
  assert capacity.pool_pages(cfg, chip, 1, max_batch=4, page_size=4, dtype_bytes=2,
                             mem_util=0.5, max_model_len=800) is None


def test_plan_and_map_agree_on_a_saturating_placement():
  """The plain planner's search and the map's scoring of the same runs give one rate."""
  cfg = config_lib.load_config_module("configs/plan_default.py").get_config()
  cfg.plan.min_duration_s = 5.0
  mcfg = config_lib.validate(cfg)
  pl = Placement("colocated", (("colocated", 2, 1),))
  (row,) = search([pl], lambda p, r: plan_lib.evaluate(cfg, mcfg, p, r),
                  plan_lib.sustains(cfg), lo=32.0, hi=64.0, rel_tol=0.1)
  assert row.search.saturated and row.search.points == [
      (32.0, True), (64.0, True), (96.0, True), (104.0, False), (112.0, False), (128.0, False)]
  assert row.rate == 96.0 and row.per_chip == 48.0
  slo = (cfg.slo.ttft_s, cfg.slo.tpot_s)
  # 104 req/s fails on growth alone: 90.8% of its requests meet the SLO, but its latencies
  # grow from the middle to the last third of arrivals (attainment alone would report 104).
  at_104 = row.search.records[3]
  assert at_104.attainment(*slo) == 472 / 520 and not at_104.stable
  assert goodput(row.search.records, *slo, cfg.slo.attainment) == row.rate
  (cell,) = cells([(pl.run, pl.describe(), pl.chips, row.search.records)], [slo[0]], [slo[1]],
                  cfg.slo.attainment)
  assert cell.best["colocated"] == (row.per_chip, "2xTP1")


REASON = ("no rate up to 65536 req/s failed: the model is too small for this hardware (or "
          "each rate's window too short for a queue to grow: plan.min_duration_s), raise "
          "plan.rate_hi or use a published shape")


def test_the_old_default_ranks_nothing(tmp_path):
  """The old default (the run's config: `tiny` on h200, 300 requests per rate, no minimum
  window) on 2 chips at TP1: every rate up to the cap passes, so no row is ranked."""
  proc = subprocess.run(
      [sys.executable, "-m", "pdjax.plan", "--config=configs/default.py",
       "--config.plan.chip_budget=2", "--config.plan.tp_choices=(1,)",
       "--config.plan.num_requests=300", "--config.plan.min_duration_s=0",
       f"--workdir={tmp_path}"], capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  with open(tmp_path / "plan.csv") as f:
    rows = list(csv.DictReader(f))
  assert [(r["rank"], r["run"], r["placement"], r["goodput_rps"], r["per_chip_rps"],
           r["saturated"], r["rates_tried"]) for r in rows] == [
      ("", "colocated", "2xTP1", "", "", "false", "14"),
      ("", "chunked", "2xTP1", "", "", "false", "14"),
      ("", "disaggregated", "1xP(tp1) + 1xD(tp1)", "", "", "false", "14")]
  md = (tmp_path / "plan.md").read_text()
  assert f"- 3 of 3 placements have no goodput: {REASON}\n" in md
  assert "best " not in md and " / " not in md.split("## Ranking")[1]
  assert f"- 3 of 3 placements have no goodput: {REASON}" in proc.stdout.splitlines()
  assert "model: tiny (preset, " in proc.stdout and "backend: sim (roofline cost model, h200)" \
      in proc.stdout
  warning = ("warning: the `tiny` preset is a 2-layer toy: simulated numbers for it describe "
             "no real model (use a published shape, e.g. model.preset=llama3_8b)")
  assert proc.stderr.splitlines().count(warning) == 1


def test_plan_rejects_a_bad_budget():
  # Without --config the planner plans its own default (plan_default.py: rates from 16 to 48).
  proc = subprocess.run([sys.executable, "-m", "pdjax.plan", "--config.plan.chip_budget=1"],
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2
  assert proc.stderr.strip() == ("config error: plan.chip_budget=1 (>= 2), "
                                 "plan.num_requests=300 (>= 1), plan.rate_lo=16.0 < "
                                 "plan.rate_hi=48.0 (> 0) required")
