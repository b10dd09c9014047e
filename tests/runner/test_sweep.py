"""pdjax.sweep: overrides, labels, repeats (means, half-widths, the "Differences" section), the
shipped ablation configs, and small sweeps end to end (simulated; one on the real engine)."""

import csv
import json
import os
import subprocess
import sys
import textwrap

import ml_collections
import pytest

from helpers.paths import ROOT
from pdjax import config as config_lib
from pdjax.metrics import compare, intervals
from pdjax.metrics.sweep_tables import CSV_COLUMNS, differences, row_of
from pdjax.runner.sweep_points import apply_overrides, label_of, load_sweep, point_names


def _cfg():
  c = ml_collections.ConfigDict({"scheduler": {"path": "always_disagg", "length_threshold": 1},
                                 "workload": {"rate": 1.0}})
  c.lock()
  return c


def test_apply_overrides_copies_and_sets():
  base = _cfg()
  new = apply_overrides(base, {"scheduler.length_threshold": 64, "workload.rate": 4.0})
  assert (new.scheduler.length_threshold, new.workload.rate) == (64, 4.0)
  assert (base.scheduler.length_threshold, base.workload.rate) == (1, 1.0)


def test_apply_overrides_unknown_key_is_one_line():
  with pytest.raises(config_lib.ConfigError) as e:
    apply_overrides(_cfg(), {"scheduler.lenght_threshold": 64})
  assert str(e.value) == "sweep override 'scheduler.lenght_threshold': unknown config key"


def test_labels_and_missing_get_sweep(tmp_path):
  assert label_of({"cluster.prefill.instances": 1, "cluster.decode.instances": 3}) == (
      "prefill.instances=1,decode.instances=3")
  assert label_of({}) == "base"
  path = tmp_path / "c.py"
  path.write_text("def get_config(arg=None):\n  return None\n")
  with pytest.raises(ValueError) as e:
    load_sweep(str(path))
  assert str(e.value) == f"{path} defines no get_sweep()"


@pytest.mark.slow
def test_pd_ratio_sweep_end_to_end(tmp_path):
  workdir = tmp_path / "sweep"
  proc = subprocess.run(
      [sys.executable, "-m", "pdjax.sweep", "--config=configs/pd_ratio.py:smoke",
       f"--workdir={workdir}", "--config.workload.num_requests=4", "--config.progress=False",
       f"--config.compile_cache_dir={os.environ['PDJAX_TEST_COMPILE_CACHE']}"],
      capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = list(csv.DictReader(open(workdir / "sweep.csv")))
  assert [(r["label"], r["run"], r["finished"]) for r in rows] == [
      ("prefill.instances=1,decode.instances=3", "disaggregated", "4"),
      ("prefill.instances=2,decode.instances=2", "disaggregated", "4"),
      ("prefill.instances=3,decode.instances=1", "disaggregated", "4")]
  assert os.path.getsize(workdir / "plots" / "sweep_metrics.png") > 0
  assert sorted(os.listdir(workdir / "00-prefill.instances=1,decode.instances=3" /
                           "disaggregated"))[:3] == ["config.json", "plots", "report.md"]


def _summary(ttft_p99: float, tpot_p99: float = 0.01, attainment: float = 1.0,
             goodput: float = 5.0) -> dict:
  """The parts of a run's summary.json the sweep rows read."""
  return {"ttft_s": {"p50": ttft_p99 / 2, "p99": ttft_p99},
          "tpot_s": {"p50": tpot_p99 / 2, "p99": tpot_p99}, "slo_attainment": attainment,
          "goodput_rps": goodput, "output_tok_s": 100.0,
          "requests": {"finished": 4, "total": 4, "rejected": 0},
          "kv_transfer": {"count": 4, "p99_s": 0.002}}


def _aggregate(values: list[float], **kw) -> dict:
  return compare.aggregate_repeats("disaggregated", [_summary(v, **kw) for v in values],
                                   [0, 1, 2])


def test_row_of_repeats_means_and_half_widths():
  row = row_of(1, "rate=2", "disaggregated", _aggregate([0.100, 0.110, 0.120]), 4)
  assert (row["repeats"], row["ttft_p99_ms"], row["ttft_p99_ms_hw"]) == (3, 110.0, 24.84)
  assert (row["ttft_p50_ms"], row["ttft_p50_ms_hw"]) == (55.0, 12.42)
  assert (row["finished"], row["rejected"], row["kv_transfers"], row["chips"]) == (12, 0, 4.0, 4)
  one = row_of(0, "base", "colocated", _summary(0.1), 2)
  assert (one["repeats"], one["ttft_p99_ms"], one["ttft_p99_ms_hw"], one["finished"],
          one["kv_transfers"]) == (1, 100.0, None, 4, 4)
  assert set(row) == set(CSV_COLUMNS)


def test_differences_beyond_and_within_noise():
  """b is 20 ms slower than a on every seed (beyond the noise though the marginal intervals
  overlap); c equals a on every seed."""
  a, b, c = _aggregate([0.1, 0.2, 0.3]), _aggregate([0.12, 0.22, 0.32]), _aggregate([0.1, 0.2, 0.3])
  lines = differences([("a", {"disaggregated": a}), ("b", {"disaggregated": b}),
                       ("c", {"disaggregated": c})])
  assert lines[4:6] == ["### disaggregated: points", ""]
  assert lines[6] == ("- TTFT p99 (ms): lowest a (200.0 ± 248.4); beyond the noise: b (220.0 ± "
                      "248.4; +20.0 ± 0.0 paired); within noise: c (200.0 ± 248.4; +0.0 ± 0.0 "
                      "paired)")
  assert lines[7] == ("- TPOT p99 (ms): all within noise: lowest a (10.0 ± 0.0); "
                      "b (10.0 ± 0.0; +0.0 ± 0.0 paired), c (10.0 ± 0.0; +0.0 ± 0.0 paired)")
  assert len(lines) == 10
  one = differences([("a", {"colocated": _summary(0.1)}), ("b", {"colocated": _summary(0.2)})])
  assert one[2] == ("One run per point: no noise estimate, so no difference is known to exceed "
                    "the noise (set repeats >= 2).")


def test_point_names():
  assert point_names([{"cluster.prefill.instances": 1, "cluster.decode.instances": 3},
                      {"workload.rate": 2.0}]) == [
      "prefill.instances=1,decode.instances=3", "rate=2.0"]
  assert point_names([{"scheduler.decode_router": "random"}] * 2 + [{}]) == [
      "00-scheduler.decode_router=random", "01-scheduler.decode_router=random", "base"]


ABLATIONS = ("ablate_router", "ablate_path", "pd_ratio", "colocated_vs_disagg")


@pytest.mark.parametrize("name", ABLATIONS)
def test_ablations_run_on_the_simulator_with_repeats(name):
  """Each shipped ablation's intended backend is the simulator with a published model shape
  and repeats, and every point validates (the sized KV and buckets fit its workload)."""
  module = config_lib.load_config_module(os.path.join(ROOT, "configs", f"{name}.py"))
  cfg = module.get_config()
  assert (cfg.backend, cfg.model.preset != "tiny", cfg.repeats >= 3) == ("sim", True, True)
  for overrides in module.get_sweep():
    config_lib.validate(apply_overrides(cfg, overrides))


SIM_SWEEP = textwrap.dedent("""
    from pdjax.configs import default

    def get_config(arg=None):
      c = default.get_config("smoke")
      c.mode, c.backend, c.repeats, c.progress = "disaggregated", "sim", 2, False
      c.workload.num_requests = 6
      return c

    def get_sweep():   # two equal points: every paired difference is 0
      return [{"scheduler.decode_router": "round_robin"}] * 2
    """)


def test_simulated_sweep_with_repeats(tmp_path):
  """Two identical points, 2 repeats each, on the simulator: sweep.csv's means and
  half-widths are those of the repeats' summaries, sweep.md says they are within noise, and
  the tiny preset's warning is printed once."""
  from pdjax.metrics.run_info import REAL_MODELS_NOTE
  config, workdir = tmp_path / "sweep_cfg.py", tmp_path / "out"
  config.write_text(SIM_SWEEP)
  proc = subprocess.run([sys.executable, "-m", "pdjax.sweep", f"--config={config}",
                         f"--workdir={workdir}"], capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert [l for l in proc.stderr.splitlines() if "tiny" in l] == [f"warning: {REAL_MODELS_NOTE}"]
  with open(workdir / "sweep.csv") as f:
    assert next(csv.reader(f)) == CSV_COLUMNS
  rows = list(csv.DictReader(open(workdir / "sweep.csv")))
  names = [f"{i:02d}-scheduler.decode_router=round_robin" for i in range(2)]
  stats = []
  for name, row in zip(names, rows):
    reps = [json.load(open(workdir / name / "disaggregated" / f"repeat-{k}" / "summary.json"))
            for k in range(2)]
    assert (row["repeats"], row["finished"]) == ("2", str(sum(r["requests"]["finished"]
                                                              for r in reps)))
    st = {}
    for col, value, scale, digits in (
        ("ttft_p99_ms", lambda r: r["ttft_s"]["p99"], 1e3, 2),
        ("tpot_p99_ms", lambda r: r["tpot_s"]["p99"], 1e3, 2),
        ("slo_attainment", lambda r: r["slo_attainment"], 1, 4),
        ("goodput_rps", lambda r: r["goodput_rps"], 1, 3)):
      st[col] = intervals.interval([value(r) for r in reps])
      assert float(row[col]) == round(scale * st[col]["mean"], digits), col
      assert float(row[f"{col}_hw"]) == round(scale * st[col]["half_width"], digits), col
    assert st["ttft_p99_ms"]["half_width"] > 0   # the two seeds served other workloads
    stats.append(st)
  md = open(workdir / "sweep.md").read()
  assert f"| {rows[0]['ttft_p99_ms']} ± {rows[0]['ttft_p99_ms_hw']} |" in md
  ttft = [f"{s['ttft_p99_ms']['mean'] * 1e3:.1f} ± {s['ttft_p99_ms']['half_width'] * 1e3:.1f}"
          for s in stats]
  assert md.split("## Differences\n")[1].splitlines()[5] == (
      f"- TTFT p99 (ms): all within noise: lowest {names[0]} ({ttft[0]}); "
      f"{names[1]} ({ttft[1]}; +0.0 ± 0.0 paired)")
  assert md.count("all within noise") == 4
