"""A command's simulated runs in a process pool (sim.workers, runner/parallel_runs.py): every
file written is the same as in-process, the pool keeps the tasks' order whatever order they
finish in, a worker's error is raised with its message, and sim.workers is checked."""

import json
import os
import subprocess
import sys
import time

import pytest

from pdjax import config as config_lib
from pdjax import process_pool
from pdjax.configs.default import get_config
from pdjax.runner.parallel_runs import SMALL_RUN, balanced_size, workers_for


def _files(workdir) -> dict:
  """Every file's bytes under workdir; config.json without sim.workers (the setting compared)
  and summary.json without `process` (this process's resident memory and memory maps after the
  run: metrics/process.py), both parsed. No file carries a wall-clock time on the simulator."""
  out = {}
  for root, _, names in os.walk(workdir):
    for name in names:
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        data = f.read()
      if name == "config.json":
        data = json.loads(data)
        data["sim"].pop("workers")
      elif name == "summary.json":
        data = json.loads(data)
        data.pop("process", None)
      out[os.path.relpath(path, workdir)] = data
  return out


def _run(workdir, workers: int) -> subprocess.CompletedProcess:
  proc = subprocess.run(
      [sys.executable, "-m", "pdjax.run", "--config=configs/default.py:smoke",
       f"--workdir={workdir}", "--config.backend=sim", "--config.repeats=2",
       "--config.progress=False", f"--config.sim.workers={workers}"],
      capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc


def test_the_files_do_not_depend_on_the_pool_size(tmp_path):
  one, two = _run(tmp_path / "one", 1), _run(tmp_path / "two", 2)
  assert "6 runs on 2 processes" in two.stderr and "processes" not in one.stderr
  got = {w: _files(tmp_path / w) for w in ("one", "two")}
  modes = ("colocated", "chunked", "disaggregated")
  expected = {"compare.md", "plots/latency_cdf.png"} | {f"{m}/summary.json" for m in modes}
  for m in modes:
    for k in (0, 1):
      expected |= {f"{m}/repeat-{k}/{name}" for name in (
          "config.json", "requests.jsonl", "summary.json", "report.md", "trace.json",
          "plots/latency_cdf.png", "plots/tier_timeline.png")}
  assert set(got["one"]) == expected
  assert [got["one"][f"colocated/repeat-{k}/config.json"]["seed"] for k in (0, 1)] == [0, 1]
  for name in sorted(expected):
    assert got["two"][name] == got["one"][name], name
  assert (one.stdout.replace(str(tmp_path / "one"), "W")
          == two.stdout.replace(str(tmp_path / "two"), "W"))


def _sleep_then_return(item):
  time.sleep(item[1])
  return item[0]


def test_results_come_in_the_tasks_order():
  # the first task finishes last
  items = [(0, 1.5), (1, 0.0), (2, 0.0), (3, 0.0)]
  done = []
  assert process_pool.run_in_order(_sleep_then_return, items, 2,
                                   on_done=lambda: done.append(1)) == [0, 1, 2, 3]
  assert len(done) == 4


def _fail(item):
  raise ValueError(f"task {item} failed")


def test_a_workers_error_is_raised_with_its_message():
  with pytest.raises(ValueError, match="task 0 failed"):
    process_pool.run_in_order(_fail, [0, 1], 2)


def test_how_many_processes():
  # 3 runs on 2 cores: 3 processes (1.5 runs' time) beat 2 (2 runs' time); 4 runs: 2
  assert [balanced_size(t, 2) for t in range(1, 10)] == [1, 2, 3, 2, 3, 2, 2, 2, 3]
  assert [balanced_size(t, 4) for t in (3, 6, 7, 16)] == [3, 6, 4, 4]
  cfg = get_config("smoke")
  cfg.backend = "sim"
  assert cfg.sim.workers == 0 and workers_for(cfg, 3) == 1   # a small run: in-process
  cfg.workload.num_requests = SMALL_RUN
  assert workers_for(cfg, 3) == balanced_size(3, os.cpu_count())
  cfg.sim.workers = 2
  assert (workers_for(cfg, 3), workers_for(cfg, 1)) == (2, 1)
  cfg.backend = "jax"
  assert workers_for(cfg, 3) == 1


@pytest.mark.parametrize("value,why", [
    (-1, "must be an integer >= 0 (0: as many as keep the cores busy, 1: in-process)"),
    (True, "must be an integer"),   # the type check answers before the range check
])
def test_sim_workers_is_checked(value, why):
  cfg = get_config("smoke")
  cfg.backend = "sim"
  cfg.sim.workers = value
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg)
  assert str(e.value) == f"sim.workers={value!r} {why}"
