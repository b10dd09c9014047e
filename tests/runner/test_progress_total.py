"""The progress bar's total is the number of requests the workload actually loaded: a trace
capped at workload.num_requests=50 that holds fewer shows n/n, not n/50."""

import json
import subprocess
import sys


def test_progress_total_is_the_loaded_request_count(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "pdjax.run", "--config=configs/default.py:smoke",
       "--config.backend=sim", "--config.mode=colocated", "--config.workload.kind=jsonl",
       "--config.workload.path=tests/fixtures/trace_small.jsonl",
       "--config.workload.num_requests=50", "--config.progress=True",
       f"--workdir={tmp_path}"], capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  n = json.loads((tmp_path / "summary.json").read_text())["requests"]["total"]
  assert 0 < n < 50
  bar = proc.stderr.replace("\r", "\n")
  assert f"| {n}/{n} [" in bar
  assert "/50 [" not in bar
