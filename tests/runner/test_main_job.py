"""The README's main command, its 3 modes x 5 repeats at 12 requests a run, end to end in one
process (issue 45): it finishes; every run ends with every request finished and no page
leaked; each placement is built once for all 15 runs (colocated and chunked share the 4xTP2
instances, repeats share everything, so the programs built for repeats=5 are those of
repeats=1); the process does not grow from run to run (memory maps and resident memory
recorded in each run's summary.json); and the table it prints has the rows the README shows."""

import json
import os
import subprocess
import sys

import pytest

from helpers.paths import ROOT
from pdjax.metrics.compare import table_rows

MODES = ("colocated", "chunked", "disaggregated")
REQUESTS = 12
# Programs per placement with the default config: 3 prefill + 3 decode buckets per instance;
# 4 colocated instances: 24. Disaggregated: the same 6 per instance, and 8 transfer buckets
# (1, 2, ..., 64 and 116 pages: max_model_len 1856 / 16) of KV gathers on each of the 2
# prefill instances and of scatters on each of the 2 decode ones: 4 x 14 = 56.
PROGRAMS = {"colocated": 24, "chunked": 0, "disaggregated": 56}
MAPS_BOUND = 300                 # memory maps: a run that leaked its programs added ~5,000
RSS_BOUND = 150 * 2**20          # resident bytes over 12 runs (~200 MB a run before)


@pytest.fixture(scope="module")
def main_job(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("main_job") / "run"
  proc = subprocess.run(
      [sys.executable, "-m", "pdjax.run", f"--workdir={workdir}", "--config.progress=False",
       f"--config.workload.num_requests={REQUESTS}",
       f"--config.compile_cache_dir={os.environ['PDJAX_TEST_COMPILE_CACHE']}"],
      capture_output=True, text=True, timeout=1200, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  summaries = {(mode, k): json.loads((workdir / mode / f"repeat-{k}" / "summary.json")
                                     .read_text())
               for mode in MODES for k in range(5)}
  return workdir, proc.stdout, summaries


@pytest.mark.slow
def test_every_run_finishes_every_request_and_returns_every_page(main_job):
  _, stdout, summaries = main_job
  for (mode, k), s in summaries.items():
    assert s["run_info"]["seed"] == k, (mode, k)
    assert s["requests"] == {"total": REQUESTS, "finished": REQUESTS, "rejected": 0,
                             "failed": 0, "cancelled": 0}, (mode, k)
    assert s["kv_pages_leaked"] == 0, (mode, k)
  assert f"{5 * REQUESTS}/{5 * REQUESTS}" in next(
      line for line in stdout.splitlines() if line.startswith("finished/total"))


@pytest.mark.slow
def test_each_placement_is_built_once_for_every_run(main_job):
  _, _, summaries = main_job
  built = {(mode, k): s["compiles"] + s["compiles_from_cache"]
           for (mode, k), s in summaries.items()}
  assert {mode: built[mode, 0] for mode in MODES} == PROGRAMS
  assert {key: n for key, n in built.items() if key[1] > 0} == {
      (mode, k): 0 for mode in MODES for k in range(1, 5)}


@pytest.mark.slow
def test_the_process_does_not_grow_from_run_to_run(main_job):
  _, _, summaries = main_job
  order = [(mode, k) for k in range(5) for mode in MODES]   # the order the runs ran in
  third, last = summaries[order[2]]["process"], summaries[order[-1]]["process"]
  assert last["memory_maps"] - third["memory_maps"] <= MAPS_BOUND, (third, last)
  assert last["rss_bytes"] - third["rss_bytes"] <= RSS_BOUND, (third, last)


@pytest.mark.slow
def test_the_printed_table_has_the_readme_rows(main_job):
  _, stdout, _ = main_job
  readme = (ROOT / "README.md").read_text()
  assert table_rows(stdout) == table_rows(readme)
