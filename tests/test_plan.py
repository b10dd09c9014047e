"""The capacity planner: placement enumeration, the rate search, the optimum of a toy cost model
computed by hand, memory sizing, and the CLI end to end on the simulator."""

import csv
import subprocess
import sys

import pytest

from pdjax.models.llama_config import LlamaConfig
from pdjax.planning import capacity
from pdjax.planning.search import Placement, best_by_run, max_rate, placements, search
from pdjax.sim.hardware import Hardware


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
  def attainment(rate):
    seen.append(rate)
    return 1.0 if rate <= 13.3 else 0.2
  rate, points = max_rate(attainment, 0.9, lo=1.0, hi=4.0, rel_tol=0.05)
  assert seen[:4] == [1.0, 4.0, 8.0, 16.0]           # widen while hi passes
  assert 13.3 * 0.95 <= rate <= 13.3
  assert points == sorted(points)
  assert max_rate(lambda r: 0.0, 0.9, lo=1.0, hi=4.0, rel_tol=0.05) == (None, [(1.0, 0.0)])


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
                lambda p, rate: 1.0 if rate <= _capacity(p) else 0.5,
                target=0.9, lo=0.1, hi=0.2, rel_tol=0.01)
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


@pytest.mark.slow
def test_plan_cli_on_the_simulator(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "pdjax.plan", "--config=configs/default.py",
       "--config.plan.chip_budget=2", "--config.plan.tp_choices=(1,)",
       "--config.plan.num_requests=40", "--config.sim.hardware=tpu_v5e",
       f"--workdir={tmp_path}"], capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  with open(tmp_path / "plan.csv") as f:
    rows = list(csv.DictReader(f))
  assert sorted((r["run"], r["placement"]) for r in rows) == [
      ("chunked", "2xTP1"), ("colocated", "2xTP1"), ("disaggregated", "1xP(tp1) + 1xD(tp1)")]
  assert [r["rank"] for r in rows] == ["1", "2", "3"]
  assert all(float(r["per_chip_rps"]) > 0 for r in rows)
  assert (tmp_path / "plots" / "plan.png").stat().st_size > 0
  assert "best disaggregated: 1xP(tp1) + 1xD(tp1) (2 chips)" in proc.stdout


def test_plan_rejects_a_bad_budget():
  proc = subprocess.run([sys.executable, "-m", "pdjax.plan", "--config.plan.chip_budget=1"],
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2
  assert proc.stderr.strip() == ("config error: plan.chip_budget=1 (>= 2), "
                                 "plan.num_requests=300 (>= 1), plan.rate_lo=1.0 < "
                                 "plan.rate_hi=16.0 (> 0) required")
