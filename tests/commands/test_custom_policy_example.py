"""examples/custom_policy/ (docs/policies.md's worked example) runs as the page says: its
router, path policy, scorer, workload function and chip file, from another working directory,
on the simulator and (slow) the engine; its sweep compares the router with least_loaded."""

import json
import os
import subprocess
import sys

import pytest

from helpers.paths import ROOT

STUDY = ROOT / "examples" / "custom_policy" / "study.py"


def _run(tmp_path, *flags, command="pdjax.run"):
  workdir = tmp_path / "out"
  proc = subprocess.run([sys.executable, "-m", command, f"--config={STUDY}",
                         f"--workdir={workdir}", "--config.progress=False", *flags],
                        capture_output=True, text=True, timeout=900, cwd=tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return workdir, proc.stdout


def _check_paths(rows, local_below=48):
  """The path policy's rule, request by request: a prompt under `local_below` tokens (nothing
  cached: no prefix cache) stays on its decode instance while it has a slot; longer ones go
  disaggregated. Every request finished."""
  assert {r["status"] for r in rows} == {"finished"}
  for r in rows:
    if r["prompt_len"] >= local_below:
      assert r["path"] == "disaggregated", r
    if r["path"] == "colocated":
      assert r["prompt_len"] < local_below
      assert r["prefill_instance"] == r["decode_instance"]
  assert {r["path"] for r in rows} == {"colocated", "disaggregated"}


def test_the_example_runs_on_the_simulator(tmp_path):
  workdir, _ = _run(tmp_path)
  rows = [json.loads(line) for line in (workdir / "requests.jsonl").read_text().splitlines()]
  assert len(rows) == 32
  _check_paths(rows)
  info = json.loads((workdir / "summary.json").read_text())["run_info"]
  assert info["backend"]["hardware"] == str(STUDY.parent / "lab_chip.json")
  assert info["workload"] == {"kind": "python", "path": "my_workloads:chat_bursts",
                              "time_scale": 1.0, "requests": 32}
  # the workload function's rows (ids by arrival): 8 chat turns (16-63 tokens), then 8
  # documents (256-447)
  lengths = [r["prompt_len"] for r in sorted(rows, key=lambda r: r["id"])]
  assert all(16 <= n < 64 for n in lengths[:8]) and all(256 <= n < 448 for n in lengths[8:16])


@pytest.mark.slow
def test_the_example_runs_on_the_engine(tmp_path):
  workdir, _ = _run(tmp_path, "--config.backend=jax", "--config.model.preset=tiny",
                    "--config.model.dtype=float32", "--config.workload.num_requests=10",
                    f"--config.compile_cache_dir={os.environ['PDJAX_TEST_COMPILE_CACHE']}")
  rows = [json.loads(line) for line in (workdir / "requests.jsonl").read_text().splitlines()]
  assert len(rows) == 10
  _check_paths(rows)
