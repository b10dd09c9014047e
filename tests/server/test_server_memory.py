"""Issue 25: a long-lived `pdjax.serve` keeps its memory flat. 3,000 streamed requests through
a server on the tiny preset (disaggregated, so every request also leaves a transfer record):
the server process's resident memory grows less than 20 MB between request 1,000 and 3,000
(every request was held twice, with a dict per step, sample and transfer: ~34 MB over those
2,000 requests on main before), and requests.jsonl holds each request, written as it ended."""

import json
import os
import random
import signal

import pytest

from pdjax.client import bench as bench_serve
from pdjax.request import Request, SamplingParams

from helpers.server_process import start_server

pytestmark = pytest.mark.slow

WINDOW, WINDOWS, RATE = 500, 6, 60.0


def _rss_bytes(pid: int) -> int:
  with open(f"/proc/{pid}/status") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) * 1024
  raise AssertionError(f"no VmRSS for process {pid}")


def test_resident_memory_stays_flat_over_3000_requests(tmp_path):
  workdir = str(tmp_path / "run")
  log = open(tmp_path / "serve.log", "w")
  proc, url = start_server(["--config=configs/default.py:smoke", "--config.mode=disaggregated"],
                           workdir, log)
  rng, rss, failed = random.Random(0), {}, 0
  try:
    for w in range(WINDOWS):
      reqs = [Request(id=f"r{w * WINDOW + i}", arrival_s=i / RATE,
                      prompt_ids=[rng.randrange(1, 256) for _ in range(32)],
                      sampling=SamplingParams(max_new_tokens=16, ignore_eos=True))
              for i in range(WINDOW)]
      result = bench_serve.run_benchmark(url, reqs, model="tiny")
      failed += result["failed"]
      rss[(w + 1) * WINDOW] = _rss_bytes(proc.pid)
  finally:
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=300)
    log.close()
  growth_mb = (rss[3000] - rss[1000]) / 1e6
  print(f"server RSS at requests 1000 / 3000: {rss[1000] / 1e6:.1f} / {rss[3000] / 1e6:.1f} MB")
  assert (code, failed) == (0, 0)
  assert growth_mb < 20, f"resident memory grew {growth_mb:.1f} MB: {rss}"
  with open(os.path.join(workdir, "requests.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  assert len(rows) == 3000 and {r["status"] for r in rows} == {"finished"}
  assert all(len(r["output_ids"]) == 16 for r in rows)
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  assert (summary["requests"]["finished"], summary["kv_pages_leaked"]) == (3000, 0)
  assert summary["kv_transfer"]["count"] == 3000
