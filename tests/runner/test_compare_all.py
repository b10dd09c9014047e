"""mode=compare_all (issue 49, item 1): compare's three runs and hybrid (its path: taichi) on
one workload, side by side with 95% intervals, on the simulator."""

import json
import subprocess
import sys

COLUMNS = ["colocated", "chunked", "disaggregated", "hybrid"]


def test_compare_all_prints_four_columns_with_intervals(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "pdjax.run", "--config=configs/default.py:smoke",
       "--config.backend=sim", "--config.mode=compare_all", "--config.repeats=2",
       "--config.workload.num_requests=4", "--config.progress=False",
       f"--workdir={tmp_path}"], capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  lines = proc.stdout.splitlines()
  header = next(line for line in lines if line.startswith("metric "))
  assert header.split() == ["metric"] + COLUMNS
  ttft = next(line for line in lines if line.startswith("TTFT p50 (ms)"))
  cells = ttft[len("TTFT p50 (ms)"):].split()
  assert len(cells) == 12 and cells[1::3] == ["±"] * 4   # value ± half-width, four times
  placement = next(line for line in lines if line.startswith("placement"))
  assert placement.split()[-3:] == ["2xPH(tp2)", "+", "2xDH(tp2)"]
  compare_md = (tmp_path / "compare.md").read_text()
  assert "| metric | colocated | chunked | disaggregated | hybrid |" in compare_md
  for k in (0, 1):
    summary = json.loads((tmp_path / "hybrid" / f"repeat-{k}" / "summary.json").read_text())
    assert summary["requests"]["finished"] == 4 and summary["kv_pages_leaked"] == 0
    assert sum(summary["hybrid"]["paths"].values()) == 4
  reasons = [json.loads(line)["path_reason"]["policy"]
             for line in (tmp_path / "hybrid" / "repeat-0" / "requests.jsonl").open()]
  disagg = [json.loads(line)["path_reason"]["policy"]
            for line in (tmp_path / "disaggregated" / "repeat-0" / "requests.jsonl").open()]
  assert reasons == ["taichi"] * 4 and disagg == ["always_disagg"] * 4
