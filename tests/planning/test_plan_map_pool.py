"""The planner's searches in a process pool (planning/pool.py): the map's files and the plain
planner's searches the same whatever the pool size, a worker's error raised with its message,
and plan.workers' check."""

import csv
import functools
import io
import os

import numpy as np
import pytest

from helpers.paths import FIXTURES
from pdjax import config as config_lib
from pdjax.planning import map_mode, map_walks, placement_runs, pool, workload_mix
from pdjax.planning.map_search import Lattice
from pdjax.planning.search import Placement, placements, search
from test_plan_map import _tiny_map_config

AZURE = os.path.join(FIXTURES, "azure_small.csv")


def _files(workdir) -> dict:
  """Every output file's bytes; runs.csv without its wall_s values and map.md without its
  'map written in N s' (timings), runs.npz as its arrays (a zip stamps the time)."""
  out = {}
  for root, _, names in os.walk(workdir):
    for name in names:
      path = os.path.join(root, name)
      rel = os.path.relpath(path, workdir)
      if name == "runs.npz":
        with np.load(path) as data:
          out[rel] = {k: data[k].tobytes() for k in data.files}
        continue
      with open(path, "rb") as f:
        out[rel] = f.read()
  rows = list(csv.DictReader(io.StringIO(out["runs.csv"].decode())))
  out["runs.csv"] = [{**r, "wall_s": ""} for r in rows]
  out["map.md"] = [line for line in out["map.md"].decode().splitlines()
                   if "simulated runs" not in line]
  return out


def test_the_maps_files_do_not_depend_on_the_pool_size(tmp_path):
  # Two hardware x two mixes (one a trace's resampled lengths) x 3 placements: 12 walks.
  got = {}
  for workers in (1, 2):
    cfg = _tiny_map_config()
    cfg.workload.kind, cfg.workload.path = "azure", AZURE
    cfg.plan.map_hardware, cfg.plan.map_mixes = "tpu_v5e,h100", "workload,config"
    cfg.plan.workers = workers
    map_mode.run_map(cfg, str(tmp_path / str(workers)))
    got[workers] = _files(tmp_path / str(workers))
  assert sorted(got[1]) == ["map.csv", "map.md", "plots/map_tiny_h100.png",
                            "plots/map_tiny_tpu_v5e.png", "runs.csv", "runs.npz",
                            "workload_resampled.jsonl"]
  assert len(got[1]["runs.csv"]) == 24
  assert got[2] == got[1]


def test_the_plain_planners_searches_do_not_depend_on_the_pool_size(tmp_path):
  cfg = _tiny_map_config()
  cfg.workload.kind, cfg.workload.path = "azure", AZURE
  mcfg = config_lib.validate(cfg)
  got = {}
  for workers in (1, 2):
    trace = workload_mix.trace_lengths(cfg, mcfg, str(tmp_path / f"w{workers}.jsonl"))
    rows = search(placements(2, (1,), lambda t: True),
                  functools.partial(placement_runs.evaluate, cfg, mcfg, trace=trace),
                  placement_runs.sustains(cfg), lo=800.0, hi=3200.0, rel_tol=0.3,
                  max_doublings=2, workers=workers)
    got[workers] = [(r.placement, r.rate, r.search.saturated, r.search.points,
                     r.search.tried, [(x.ttft.tobytes(), x.tpot.tobytes())
                                      for x in r.search.records]) for r in rows]
  # The toy never saturates: every search runs lo, hi and its 2 doublings.
  assert [(p.run, rate, tried) for p, rate, _, _, tried, _ in got[1]] == [
      (run, None, [800.0, 3200.0, 6400.0, 12800.0])
      for run in ("colocated", "chunked", "disaggregated")]
  assert got[2] == got[1]


def test_a_workers_error_is_raised_with_its_message():
  cfg = _tiny_map_config()
  cfg.workload.kind, cfg.workload.path = "azure", AZURE   # a trace, but no trace given
  mcfg = config_lib.validate(cfg)
  pl = Placement("colocated", (("colocated", 2, 1),))
  tasks = [map_walks.WalkTask(("tiny", "tpu_v5e", "config"), cfg, mcfg, None, pl,
                              Lattice(400.0, 1600.0, 4.0), 0, [(0.01, 0.01)], 0.9)] * 2
  with pytest.raises(ValueError, match="a trace workload is planned from its resampled "
                                       "lengths: pass trace"):
    map_walks.run_walks(tasks, 2)


def test_pool_size():
  assert pool.pool_size(0, 1000) == os.cpu_count()
  assert (pool.pool_size(4, 2), pool.pool_size(1, 9), pool.pool_size(3, 9)) == (
      2, 1, 3)


@pytest.mark.parametrize("value,why", [
    (-1, "must be an integer >= 0 (0: one process per core, 1: in-process)"),
    (True, "must be an integer"),   # the type check answers before the range check
])
def test_plan_workers_is_checked(value, why):
  cfg = _tiny_map_config()
  cfg.plan.workers = value
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg)
  assert str(e.value) == f"plan.workers={value!r} {why}"
