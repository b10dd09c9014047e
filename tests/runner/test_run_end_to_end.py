"""`python -m pdjax.run` on the smoke variant of the default config: files, fields, invariants."""

import json
import os
import subprocess
import sys

import pytest

REQUEST_FIELDS = {"id", "status", "prompt_len", "output_ids", "ttft_s", "tpot_s", "e2e_s", "path",
                  "prefill_instance", "decode_instance", "transfer_bytes", "transfer_s"}


@pytest.mark.slow
def test_compare_run_writes_both_modes(tmp_path):
  workdir = tmp_path / "run"
  proc = subprocess.run(
      [sys.executable, "-m", "pdjax.run", "--config=configs/default.py:smoke",
       f"--workdir={workdir}", "--config.progress=False",
       f"--config.compile_cache_dir={os.environ['PDJAX_TEST_COMPILE_CACHE']}"],
      capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "TTFT p50 (ms)" in proc.stdout and "disaggregated" in proc.stdout
  assert "chunked" in proc.stdout
  assert sorted(os.listdir(workdir)) == ["chunked", "colocated", "compare.md", "disaggregated",
                                         "plots"]
  assert "net" in (workdir / "compare.md").read_text()
  outputs = {}
  for mode in ("colocated", "chunked", "disaggregated"):
    d = workdir / mode
    assert sorted(os.listdir(d)) == ["config.json", "plots", "report.md", "requests.jsonl",
                                     "summary.json", "trace.json"]
    assert sorted(os.listdir(d / "plots")) == ["latency_cdf.png", "tier_timeline.png"]
    trace = json.loads((d / "trace.json").read_text())
    assert {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"} >= {"queue", "prefill",
                                                                            "decode"}
    summary = json.loads((d / "summary.json").read_text())
    assert summary["mode"] == mode
    assert summary["requests"] == {"total": 8, "finished": 8, "rejected": 0, "failed": 0,
                                   "cancelled": 0}
    assert summary["kv_pages_leaked"] == 0
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
      assert set(summary[key]) == {"mean", "p50", "p90", "p99"}
    assert set(summary["kv_transfer"]) == {"count", "bytes", "mean_s", "p99_s", "failures",
                                           "exposed_mean_s", "exposed_p99_s"}
    # chunked runs on the colocated run's instances (one placement, built once: issue 45);
    # exact counts: test_compiles.py, test_main_job.py
    built = summary["compiles"] + summary["compiles_from_cache"]
    assert (built == 0) if mode == "chunked" else (built > 0), (mode, built)
    assert 0 <= summary["slo_attainment"] <= 1
    rows = [json.loads(line) for line in (d / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and all(REQUEST_FIELDS <= set(r) for r in rows)
    assert {r["path"] for r in rows} == {"disaggregated" if mode == "disaggregated"
                                         else "colocated"}
    outputs[mode] = [r["output_ids"] for r in rows]
    assert json.loads((d / "config.json").read_text())["mode"] == mode
  moved = [r for r in rows if r["decode_instance"]]   # disaggregated rows
  assert summary["kv_transfer"]["count"] == len(moved) > 0
  assert summary["kv_transfer"]["bytes"] == sum(r["transfer_bytes"] for r in moved)
  # Same workload, greedy, float32: all three runs produce the same tokens (chunked prefill
  # computes prompts in 64-token chunks mixed with decode rows).
  assert outputs["colocated"] == outputs["chunked"] == outputs["disaggregated"]
  assert any(len(r) > 0 for r in outputs["chunked"])
