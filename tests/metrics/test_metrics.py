"""Tests for pdjax.metrics: exact metric values on hand-made requests, and run files."""

import json

import pytest

from pdjax.metrics.compare import compare_table
from pdjax.metrics.report import write_run_files
from pdjax.metrics.summary import percentiles, summarize
from pdjax.request import Request, SamplingParams, Status


def make_request(rid, arrival, token_times, status=Status.FINISHED):
  r = Request(id=rid, arrival_s=arrival, prompt_ids=[1, 2, 3],
              sampling=SamplingParams(max_new_tokens=8))
  for i, t in enumerate(token_times):
    r.add_token(10 + i, t)
  if status != Status.WAITING:
    r.finish(status, token_times[-1] if token_times else arrival)
  return r


def summarize_default(requests, transfers=(), duration_s=2.0):
  return summarize(requests, mode="colocated", duration_s=duration_s, slo_ttft_s=0.25,
                   slo_tpot_s=0.4, transfers=list(transfers), compiles=3,
                   kv_pages_leaked=0)


def test_percentiles_exact():
  assert percentiles([]) == {"mean": None, "p50": None, "p90": None, "p99": None}
  p = percentiles([0.1, 0.2, 0.3])
  assert p["p50"] == 0.2
  assert p["mean"] == pytest.approx(0.2, abs=1e-15)
  assert p["p90"] == pytest.approx(0.28, abs=1e-15)
  assert p["p99"] == pytest.approx(0.298, abs=1e-15)
  p = percentiles([1, 2, 3, 4])
  assert p == {"mean": 2.5, "p50": 2.5, "p90": pytest.approx(3.7), "p99":
               pytest.approx(3.97)}
  assert all(type(v) is float for v in p.values())


def test_tpot_itl_e2e_single_request():
  r = make_request("r", 0.5, [1.0, 1.5, 2.0])
  assert (r.ttft_s, r.tpot_s, r.e2e_s, r.itl_s) == (0.5, 0.5, 1.5, [0.5, 0.5])
  s = summarize_default([r])
  assert s["ttft_s"]["p50"] == 0.5
  assert s["tpot_s"] == {"mean": 0.5, "p50": 0.5, "p90": 0.5, "p99": 0.5}
  assert s["itl_s"]["mean"] == 0.5
  assert s["e2e_s"]["p99"] == 1.5


def test_summary_counts_slo_goodput_throughput():
  reqs = [
      make_request("a", 0.0, [0.1, 0.3, 0.5]),       # ttft .1, tpot .2: meets SLO
      make_request("b", 0.0, [0.2]),                 # ttft .2, no tpot: meets SLO
      make_request("c", 0.0, [0.3, 0.4]),            # ttft .3 > .25: miss
      make_request("d", 1.0, [1.1, 2.1]),            # tpot 1.0 > .4: miss
      make_request("e", 0.0, [], Status.REJECTED),
      make_request("f", 0.0, [0.05], Status.FAILED),  # fast but failed: miss
  ]
  s = summarize_default(reqs, duration_s=2.0)
  assert s["mode"] == "colocated"
  assert s["requests"] == {"total": 6, "finished": 4, "rejected": 1, "failed": 1, "cancelled": 0}
  assert s["ttft_s"]["p50"] == pytest.approx(0.15)
  assert s["ttft_s"]["mean"] == pytest.approx(0.175)
  assert s["tpot_s"]["mean"] == pytest.approx((0.2 + 0.1 + 1.0) / 3)
  assert s["itl_s"]["p50"] == pytest.approx(0.2)  # gaps .2 .2 .1 1.0
  assert s["e2e_s"]["p50"] == pytest.approx(0.45)  # .5 .2 .4 1.1
  assert s["slo_attainment"] == pytest.approx(2 / 6)
  assert s["goodput_rps"] == 1.0
  assert s["output_tok_s"] == 4.0  # 3+1+2+2 tokens from finished requests / 2 s
  assert s["compiles"] == 3 and s["kv_pages_leaked"] == 0
  assert s["duration_s"] == 2.0 and s["slo"] == {"ttft_s": 0.25, "tpot_s": 0.4}
  assert s["kv_transfer"] == {"count": 0, "bytes": 0, "mean_s": None, "p99_s": None,
                              "failures": 0, "exposed_mean_s": None, "exposed_p99_s": None}


def test_slo_attainment_with_one_rejected():
  reqs = [make_request("a", 0.0, [0.1, 0.2]), make_request("b", 0.0, [0.1]),
          make_request("c", 0.0, [], Status.REJECTED)]
  s = summarize_default(reqs, duration_s=4.0)
  assert s["slo_attainment"] == pytest.approx(2 / 3)
  assert s["goodput_rps"] == 0.5


def test_no_requests():
  s = summarize_default([])
  assert s["slo_attainment"] == 0.0 and s["goodput_rps"] == 0.0
  assert s["requests"] == {"total": 0, "finished": 0, "rejected": 0, "failed": 0,
                           "cancelled": 0}
  assert s["ttft_s"]["p99"] is None


def test_transfer_exposed_is_the_part_after_the_prefill():
  """Streamed (sent from 0.5 s, during the prefill ending at 1.0 s, landed at 1.3 s): 0.3 s
  exposed; sent after the prefill (1.2 -> 1.6 s): all 0.4 s; no transfer: None."""
  streamed, after, local = (make_request(n, 0.0, [1.0, 2.0]) for n in "abc")
  for r, start, end in ((streamed, 0.5, 1.3), (after, 1.2, 1.6)):
    r.prefill_end_s, r.transfer_start_s, r.transfer_end_s = 1.0, start, end
  assert streamed.transfer_exposed_s == pytest.approx(0.3)
  assert after.transfer_exposed_s == pytest.approx(0.4)
  assert local.transfer_exposed_s is None and local.to_record()["transfer_exposed_s"] is None
  kv = summarize_default([streamed, after, local])["kv_transfer"]
  assert kv["exposed_mean_s"] == pytest.approx(0.35)
  assert kv["exposed_p99_s"] == pytest.approx(0.3 + 0.99 * 0.1)


def test_kv_transfer_stats():
  transfers = [{"bytes": 1024, "seconds": 0.01, "ok": True},
               {"bytes": 3072, "seconds": 0.03, "ok": True},
               {"bytes": 999, "seconds": 5.0, "ok": False}]
  kv = summarize_default([], transfers=transfers)["kv_transfer"]
  assert kv["count"] == 2 and kv["bytes"] == 4096 and kv["failures"] == 1
  assert kv["mean_s"] == pytest.approx(0.02)
  assert kv["p99_s"] == pytest.approx(0.0298)


def test_non_terminal_request_raises():
  reqs = [make_request("a", 0.0, [0.1]), make_request("b", 0.0, [0.1], Status.WAITING)]
  with pytest.raises(ValueError) as e:
    summarize_default(reqs)
  assert str(e.value) == "request b is not terminal (waiting)"


def test_write_run_files(tmp_path):
  reqs = [make_request("a", 0.0, [0.1, 0.3]), make_request("b", 0.0, [], Status.REJECTED)]
  s = summarize_default(reqs)
  workdir = tmp_path / "run"
  write_run_files(str(workdir), config_dict={"b": 1, "a": {"z": 2}}, requests=reqs,
                  summary=s)
  assert sorted(p.name for p in workdir.iterdir()) == [
      "config.json", "report.md", "requests.jsonl", "summary.json"]
  config_text = (workdir / "config.json").read_text()
  assert json.loads(config_text) == {"a": {"z": 2}, "b": 1}
  assert config_text.index('"a"') < config_text.index('"b"')
  lines = (workdir / "requests.jsonl").read_text().splitlines()
  assert [json.loads(l)["id"] for l in lines] == ["a", "b"]
  assert json.loads(lines[1])["status"] == "rejected"
  loaded = json.loads((workdir / "summary.json").read_text())
  assert loaded == s
  assert {"mode", "requests", "ttft_s", "tpot_s", "itl_s", "e2e_s", "slo_attainment",
          "goodput_rps", "output_tok_s", "kv_transfer", "compiles",
          "kv_pages_leaked"} <= set(loaded)
  report = (workdir / "report.md").read_text()
  assert report.startswith("# pdjax run: colocated\n")
  assert "| TTFT | 100.0 | 100.0 | 100.0 | 100.0 |" in report
  assert "| TPOT | 200.0 | 200.0 | 200.0 | 200.0 |" in report
  assert "2 total, 1 finished, 1 rejected, 0 failed" in report
  assert "- Leaked KV pages: 0" in report


def test_compare_table():
  a = summarize_default([make_request("a", 0.0, [0.1, 0.3]),
                         make_request("b", 0.0, [], Status.REJECTED)])
  b = summarize(
      [make_request("a", 0.0, [0.2])], mode="disaggregated", duration_s=1.0,
      slo_ttft_s=1.0, slo_tpot_s=1.0, compiles=5, kv_pages_leaked=2,
      transfers=[{"bytes": 3 * 1024 * 1024, "seconds": 0.004, "ok": True}])
  table = compare_table({"colocated": a, "disaggregated": b})
  lines = table.splitlines()
  assert lines[0].split() == ["metric", "colocated", "disaggregated"]
  labels = ["TTFT p50 (ms)", "TTFT p99 (ms)", "TPOT p50 (ms)", "TPOT p99 (ms)",
            "SLO attainment (%)", "goodput (req/s)", "output tok/s", "finished/total",
            "KV transfers (count)", "KV transfer bytes (MiB)", "KV transfer mean (ms)",
            "KV transfer p99 (ms)", "KV transfer exposed p99 (ms)", "compiles", "leaked pages"]
  body = lines[2:]
  assert [next(lab for lab in labels if r.startswith(lab)) for r in body] == labels

  def cells(label):
    row = next(r for r in body if r.startswith(label))
    return row[len(label):].split()

  assert cells("TTFT p50 (ms)") == ["100.0", "200.0"]
  assert cells("TPOT p50 (ms)") == ["200.0", "-"]
  assert cells("SLO attainment (%)") == ["50.0", "100.0"]
  assert cells("goodput (req/s)") == ["0.50", "1.00"]
  assert cells("finished/total") == ["1/2", "1/1"]
  assert cells("KV transfers (count)") == ["0", "1"]
  assert cells("KV transfer bytes (MiB)") == ["0.00", "3.00"]
  assert cells("KV transfer mean (ms)") == ["-", "4.0"]
  assert cells("KV transfer exposed p99 (ms)") == ["-", "-"]
  assert cells("compiles") == ["3", "5"]
  assert cells("leaked pages") == ["0", "2"]
  # Aligned: every row as wide as the header; columns right-aligned.
  assert len({len(l) for l in lines}) == 1
