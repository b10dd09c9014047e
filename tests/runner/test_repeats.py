"""repeats=N: each mode runs N times (seeds seed..seed+N-1) into <mode>/repeat-<k>/, and
<mode>/summary.json, the printed table and compare.md carry mean ± 95% interval."""

import json
import math
import os
import statistics
import subprocess
import sys

import pytest

from pdjax.metrics import intervals
from pdjax.metrics.compare import BY_KEY, aggregate_repeats, compare_table, conclusion

MODES = ("colocated", "chunked", "disaggregated")


def test_t_quantiles_and_interval_by_hand():
  assert intervals.t975(2) == 4.303 and intervals.t975(30) == 2.042
  assert abs(intervals.t975(1000) - 1.962) < 1e-3
  iv = intervals.interval([1.0, 2.0, 3.0])
  assert iv["mean"] == 2.0 and iv["n"] == 3
  assert iv["half_width"] == pytest.approx(4.303 * 1.0 / math.sqrt(3), rel=1e-12)
  one = intervals.interval([5.0, None])
  assert (one["n"], one["mean"], one["half_width"]) == (1, 5.0, None)
  assert intervals.differ(intervals.interval([1, 1.1, 0.9]), intervals.interval([5, 5.1, 4.9]))
  assert not intervals.differ(intervals.interval([1, 2, 3]), intervals.interval([2, 3, 4]))


@pytest.fixture(scope="module")
def repeated(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("repeats") / "run"
  proc = subprocess.run(
      [sys.executable, "-m", "pdjax.run", "--config=configs/default.py:smoke",
       f"--workdir={workdir}", "--config.progress=False", "--config.backend=sim",
       "--config.repeats=3", "--config.seed=5"],
      capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return workdir, proc.stdout


def test_three_repeat_folders_per_mode_with_their_seeds(repeated):
  workdir, _ = repeated
  for mode in MODES:
    assert sorted(os.listdir(workdir / mode)) == ["repeat-0", "repeat-1", "repeat-2",
                                                  "summary.json"]
    seeds = [json.loads((workdir / mode / f"repeat-{k}" / "config.json").read_text())["seed"]
             for k in range(3)]
    assert seeds == [5, 6, 7]


def test_intervals_recomputed_from_the_three_summaries(repeated):
  workdir, stdout = repeated
  for mode in MODES:
    agg = json.loads((workdir / mode / "summary.json").read_text())
    assert agg["repeats"]["n"] == 3 and agg["repeats"]["seeds"] == [5, 6, 7]
    assert agg["run_info"]["seed"] == [5, 6, 7]
    reps = [json.loads((workdir / mode / f"repeat-{k}" / "summary.json").read_text())
            for k in range(3)]
    for key, path in (("ttft_p99_s", ("ttft_s", "p99")), ("tpot_p50_s", ("tpot_s", "p50")),
                      ("goodput_rps", ("goodput_rps",)), ("output_tok_s", ("output_tok_s",))):
      values = []
      for s in reps:
        for p in path:
          s = s[p]
        values.append(s)
      got = agg["repeats"]["metrics"][key]
      assert got["values"] == values
      assert got["mean"] == pytest.approx(statistics.fmean(values), rel=1e-12)
      assert got["half_width"] == pytest.approx(
          4.303 * statistics.stdev(values) / math.sqrt(3), rel=1e-12)
    assert agg["repeats"]["metrics"]["finished"]["sum"] == 24
  row = next(l for l in stdout.splitlines() if l.startswith("goodput (req/s)"))
  agg = json.loads((workdir / "colocated" / "summary.json").read_text())
  g = agg["repeats"]["metrics"]["goodput_rps"]
  assert row.split()[2:5] == [f"{g['mean']:.2f}", "±", f"{g['half_width']:.2f}"]
  assert "repeats: 3 per mode" in stdout
  assert "## Conclusion" in (workdir / "compare.md").read_text()


def _summary(ttft_p99_values):
  base = {"ttft_s": {"p50": 0.1, "p99": None}, "tpot_s": {"p50": 0.01, "p99": 0.02},
          "slo_attainment": 1.0, "goodput_rps": 2.0, "output_tok_s": 10.0,
          "requests": {"finished": 4, "total": 4, "rejected": 0}, "compiles": 0,
          "compiles_from_cache": 0, "kv_pages_leaked": 0,
          "kv_transfer": {"count": 0, "bytes": 0, "mean_s": None, "p99_s": None}}
  runs = []
  for v in ttft_p99_values:
    s = json.loads(json.dumps(base))
    s["ttft_s"]["p99"] = v
    runs.append(s)
  return runs


def test_conclusion_within_noise_when_forced_equal_and_beyond_when_apart():
  same = {m: aggregate_repeats(m, _summary([0.1, 0.2, 0.3]), [0, 1, 2]) for m in ("a", "b")}
  lines = conclusion(same)
  assert ("- TTFT p99: within noise: a (200.0 ± 248.4), b (200.0 ± 248.4; difference "
          "+0.0 ± 0.0 paired over 3 seeds)") in lines
  # Apart by 400 ms on every seed: the paired difference's interval excludes 0.
  apart = {"a": aggregate_repeats("a", _summary([0.10, 0.30, 0.12]), [0, 1, 2]),
           "b": aggregate_repeats("b", _summary([0.50, 0.70, 0.52]), [0, 1, 2])}
  assert ("- TTFT p99: a wins (173.3 ± 273.7), beyond the noise over b (573.3 ± 273.7; "
          "difference +400.0 ± 0.0 paired over 3 seeds)") in conclusion(apart)
  # The same numbers on other seeds are not paired: the marginal intervals overlap.
  other = {"a": apart["a"], "b": aggregate_repeats("b", _summary([0.50, 0.70, 0.52]), [3, 4, 5])}
  assert ("- TTFT p99: within noise: a (173.3 ± 273.7), b (573.3 ± 273.7)"
          in conclusion(other))
  single = {m: _summary([0.1])[0] for m in ("a", "b")}
  assert conclusion(single)[0].startswith("- One run per mode: no noise estimate")
  assert "TTFT p99 (ms)" in compare_table(apart) and BY_KEY["ttft_p99_s"].better == "lower"
