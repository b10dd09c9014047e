"""Tests for the pdjax.metrics.report extensions: compare_table with three modes and the
extra rows, report.md extra sections, and the markdown comparison report."""

import pytest

from pdjax.metrics.benefit import net_benefit
from pdjax.metrics.compare import compare_table, write_compare_report
from pdjax.metrics.report import write_run_files
from pdjax.metrics.summary import summarize, summarize_extras
from pdjax.request import Request, SamplingParams, Status


def make(rid, token_times, status=Status.FINISHED, reason="", preemptions=0,
         prompt_len=3):
  r = Request(id=rid, arrival_s=0.0, prompt_ids=[1] * prompt_len,
              sampling=SamplingParams(max_new_tokens=8))
  for i, t in enumerate(token_times):
    r.add_token(10 + i, t)
  r.preemptions = preemptions
  r.finish(status, token_times[-1] if token_times else 0.0, reason)
  return r


def summary_of(reqs, mode, extras=True, **kw):
  s = summarize(reqs, mode=mode, duration_s=2.0, slo_ttft_s=0.25, slo_tpot_s=0.4,
                transfers=[], compiles=1, kv_pages_leaked=0)
  if extras:
    s.update(summarize_extras(reqs, duration_s=2.0, **kw))
  return s


def three_summaries():
  return {
      "colocated": summary_of([make("a", [0.1, 0.3], preemptions=2),
                               make("b", [], Status.REJECTED, "prompt_len = 9 > 8")],
                              "colocated"),
      "chunked": summary_of([make("a", [0.2, 0.3])], "chunked"),
      "disaggregated": summary_of([make("a", [0.05, 0.2])], "disaggregated",
                                  extras=False),
  }


def cells(table, label):
  row = next(r for r in table.splitlines() if r.startswith(label))
  return row[len(label):].split()


def test_compare_table_three_modes_with_extra_rows():
  table = compare_table(three_summaries())
  lines = table.splitlines()
  assert lines[0].split() == ["metric", "colocated", "chunked", "disaggregated"]
  assert len({len(l) for l in lines}) == 1
  assert cells(table, "TTFT p50 (ms)") == ["100.0", "200.0", "50.0"]
  assert cells(table, "finished/total") == ["1/2", "1/1", "1/1"]
  assert lines[-2].startswith("preemptions") and lines[-1].startswith("rejected")
  assert cells(table, "preemptions") == ["2", "0", "-"]
  assert cells(table, "rejected") == ["1", "0", "0"]


def test_compare_table_without_extras_has_no_extra_rows():
  s = {m: summary_of([make("a", [0.1])], m, extras=False) for m in ("x", "y", "z")}
  table = compare_table(s)
  assert len(table.splitlines()) == 2 + 15
  assert "preemptions" not in table and "rejected" not in table


def test_write_run_files_extra_sections(tmp_path):
  reqs = [make("a", [0.1, 0.3], preemptions=1),
          make("b", [], Status.REJECTED, "prompt_len = 5000 exceeds budget 4096"),
          make("c", [], Status.REJECTED, "prompt_len = 6000 exceeds budget 4096")]
  steps = [{"instance": "p0", "role": "prefill", "kind": "prefill", "start_s": 0.0,
            "end_s": 0.5, "num_seqs": 2, "num_tokens": 10}]
  samples = [{"t": 0.0, "instance": "p0", "role": "prefill", "queued": 2, "running": 1,
              "kv_pages_used": 4, "kv_pages_total": 8}]
  switches = [{"t": 1.0, "instance": "p0", "from": "prefill", "to": "decode"}]
  s = summary_of(reqs, "colocated", extras=False)
  extras = summarize_extras(reqs, duration_s=2.0, steps=steps, samples=samples,
                            role_switches=switches)
  write_run_files(str(tmp_path), config_dict={}, requests=reqs, summary=s, extras=extras)
  report = (tmp_path / "report.md").read_text()
  assert "- Preemptions: 1" in report
  assert "| p0 | prefill | 25.0 | 2.00 | 2 | 1.00 | 1 | 4 | 50.0 | 1/0/0 |" in report
  assert "| **prefill** (1) | prefill | 25.0 |" in report
  assert "- prefill / prefill: 2x1" in report
  assert "| prompt_len = # exceeds budget # | 2 |" in report
  assert "Role switches: 1." in report and "| 1.000 | p0 | prefill | decode |" in report
  assert "tiers" not in (tmp_path / "summary.json").read_text()
  # The same sections come from the summary itself when it holds the keys.
  s.update(extras)
  write_run_files(str(tmp_path / "b"), config_dict={}, requests=reqs, summary=s)
  assert (tmp_path / "b" / "report.md").read_text() == report


def test_write_compare_report(tmp_path):
  colo = [make("a", [0.3, 0.4, 0.5], prompt_len=50), make("c", [1.0], prompt_len=200)]
  dis = [make("a", [0.2, 0.35, 0.5], prompt_len=50), make("c", [0.4], prompt_len=200)]
  dis[0].transfer_s, dis[1].transfer_s = 0.01, 0.05
  rows = net_benefit(colo, dis, [0, 100, 150])
  path = tmp_path / "out" / "compare.md"
  write_compare_report(str(path), three_summaries(), rows)
  text = path.read_text()
  assert text.startswith("# pdjax comparison\n")
  assert "| metric | colocated | chunked | disaggregated |" in text
  assert "| TTFT p50 (ms) | 100.0 | 200.0 | 50.0 |" in text
  assert "| preemptions | 2 | 0 | - |" in text
  assert "| [0, 100) | 1 | 100.0 | 10.0 | 100.0 | -10.0 | colocated |" in text
  assert "| [100, 150) | 0 | - | - | - | - | - |" in text
  assert "| [150, inf) | 1 | 600.0 | 50.0 | 0.0 | 550.0 | disaggregated |" in text
  write_compare_report(str(tmp_path / "no_benefit.md"), three_summaries(), None)
  assert "Net benefit" not in (tmp_path / "no_benefit.md").read_text()


@pytest.mark.parametrize("n", [1, 4])
def test_compare_table_any_number_of_modes(n):
  s = {f"m{i}": summary_of([make("a", [0.1])], f"m{i}") for i in range(n)}
  assert compare_table(s).splitlines()[0].split() == ["metric", *s]
