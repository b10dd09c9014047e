"""pdjax.sweep: overrides, labels, and one small sweep end to end on the real engine."""

import csv
import os
import subprocess
import sys

import ml_collections
import pytest

from pdjax import config as config_lib
from pdjax.sweep import apply_overrides, label_of, load_sweep


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
