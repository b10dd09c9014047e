"""The README's main command, its 3 modes x 5 repeats at 12 requests a run, end to end in one
process (issue 45): it finishes; every run ends with every request finished and no page
leaked; each placement is built once for all 15 runs (colocated and chunked share the 4xTP2
instances, repeats share everything, so the programs built for repeats=5 are those of
repeats=1); the process does not grow from run to run (memory maps and resident memory
recorded in each run's summary.json); the three modes serve the same tokens (greedy, float32);
every run folder holds its files; and the table it prints has the rows the README shows."""

import json
import os
import subprocess
import sys

import pytest

from helpers.paths import ROOT
from pdjax.metrics.compare import table_rows

MODES = ("colocated", "chunked", "disaggregated")
REQUEST_FIELDS = {"id", "status", "prompt_len", "output_ids", "ttft_s", "tpot_s", "e2e_s", "path",
                  "prefill_instance", "decode_instance", "transfer_bytes", "transfer_s"}
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


@pytest.mark.slow
def test_every_run_writes_its_folder_and_the_modes_serve_the_same_tokens(main_job):
  workdir, stdout, summaries = main_job
  assert "TTFT p50 (ms)" in stdout and f"results: {workdir}" in stdout
  assert sorted(os.listdir(workdir)) == ["chunked", "colocated", "compare.md", "disaggregated",
                                         "plots"]
  assert "## Conclusion" in (workdir / "compare.md").read_text()
  assert "net" in (workdir / "compare.md").read_text()
  for k in range(5):
    outputs = {}
    for mode in MODES:
      d = workdir / mode / f"repeat-{k}"
      assert sorted(os.listdir(d)) == ["config.json", "plots", "report.md", "requests.jsonl",
                                       "summary.json", "trace.json"]
      assert sorted(os.listdir(d / "plots")) == ["latency_cdf.png", "tier_timeline.png"]
      trace = json.loads((d / "trace.json").read_text())
      assert {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"} >= {
          "queue", "prefill", "decode"}
      summary = summaries[mode, k]
      assert summary["mode"] == mode
      for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        assert set(summary[key]) == {"mean", "p50", "p90", "p99"}
      assert set(summary["kv_transfer"]) == {"count", "bytes", "mean_s", "p99_s", "failures",
                                             "exposed_mean_s", "exposed_p99_s"}
      rows = [json.loads(line) for line in (d / "requests.jsonl").read_text().splitlines()]
      assert len(rows) == REQUESTS and all(REQUEST_FIELDS <= set(r) for r in rows)
      assert {r["path"] for r in rows} == {"disaggregated" if mode == "disaggregated"
                                           else "colocated"}
      assert json.loads((d / "config.json").read_text())["mode"] == mode
      assert json.loads((d / "config.json").read_text())["seed"] == k
      outputs[mode] = [r["output_ids"] for r in rows]
    moved = [r for r in rows if r["decode_instance"]]   # the disaggregated run's rows
    assert summary["kv_transfer"]["count"] == len(moved) == REQUESTS
    assert summary["kv_transfer"]["bytes"] == sum(r["transfer_bytes"] for r in moved)
    # the same workload (its seed), greedy, float32: the same tokens in every mode, chunked
    # prefill computing prompts in 256-token chunks mixed with decode rows
    assert outputs["colocated"] == outputs["chunked"] == outputs["disaggregated"], k
    assert all(len(r) > 0 for r in outputs["chunked"])
