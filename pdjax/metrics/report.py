"""Run artifacts (config.json, requests.jsonl, summary.json, report.md) and a
side-by-side comparison of several runs' summaries (e.g. colocated, chunked,
disaggregated) as plain text or as a markdown report with the net-benefit table."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence

from pdjax.metrics.report_sections import benefit_section, extra_sections, md_table
from pdjax.request import Request

_MIB = 1024 * 1024


def _ms(seconds: float | None) -> str:
  return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def _fmt(value, spec: str) -> str:
  return "-" if value is None else format(value, spec)


EXTRA_KEYS = ("tiers", "rejects_by_reason", "preemptions", "role_switches", "kv_cache",
              "faults")


def _report_md(summary: dict, extras: dict | None = None) -> str:
  req, kv = summary["requests"], summary["kv_transfer"]
  slo = summary.get("slo", {})
  lines = [
      f"# pdjax run: {summary['mode']}",
      "",
      f"Duration {summary.get('duration_s', 0.0):.2f} s; SLO: TTFT <= "
      f"{_ms(slo.get('ttft_s'))} ms, TPOT <= {_ms(slo.get('tpot_s'))} ms.",
      "",
      "| metric (ms) | mean | p50 | p90 | p99 |",
      "|---|---:|---:|---:|---:|",
  ]
  for key, name in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"),
                    ("e2e_s", "E2E")):
    p = summary[key]
    lines.append(f"| {name} | {_ms(p['mean'])} | {_ms(p['p50'])} | "
                 f"{_ms(p['p90'])} | {_ms(p['p99'])} |")
  lines += [
      "",
      f"- Requests: {req['total']} total, {req['finished']} finished, "
      f"{req['rejected']} rejected, {req['failed']} failed"
      + (f", {req['cancelled']} cancelled by their client" if req.get("cancelled") else ""),
      f"- SLO attainment: {summary['slo_attainment'] * 100:.1f}%; goodput "
      f"{summary['goodput_rps']:.2f} req/s; output {summary['output_tok_s']:.1f} tok/s",
      f"- KV transfer: {kv['count']} ok ({kv['bytes'] / _MIB:.2f} MiB), "
      f"mean {_ms(kv['mean_s'])} ms, p99 {_ms(kv['p99_s'])} ms, "
      f"{kv['failures']} failed",
      f"- Compiles: {summary['compiles']} by XLA, "
      f"{summary.get('compiles_from_cache', 0)} served by the compilation cache",
      f"- Leaked KV pages: {summary['kv_pages_leaked']}",
      "",
  ]
  sections = {k: summary[k] for k in EXTRA_KEYS if k in summary}
  sections["num_requests"] = req["total"]
  sections.update(extras or {})
  lines += extra_sections(sections)
  return "\n".join(lines)


def write_run_files(workdir: str, *, config_dict: dict,
                    requests: Sequence[Request], summary: dict,
                    extras: dict | None = None) -> None:
  """Writes config.json, requests.jsonl, summary.json and report.md into workdir.

  report.md gains sections for whichever of EXTRA_KEYS (tiers, rejects_by_reason,
  preemptions, role_switches; see pdjax.metrics.summary.summarize_extras) the summary or
  extras holds (extras wins). extras only shapes report.md, never summary.json.
  """
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump(config_dict, f, indent=2, sort_keys=True)
  with open(os.path.join(workdir, "requests.jsonl"), "w") as f:
    for r in requests:
      f.write(json.dumps(r.to_record()) + "\n")
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
  with open(os.path.join(workdir, "report.md"), "w") as f:
    f.write(_report_md(summary, extras))


def _compiles_cell(s: dict) -> str:
  """XLA compiles, then "(+N cached)" when a compilation cache served N programs."""
  cached = s.get("compiles_from_cache") or 0
  return _fmt(s["compiles"], "d") + (f" (+{cached} cached)" if cached else "")


_ROWS: list[tuple[str, Callable[[dict], str]]] = [
    ("TTFT p50 (ms)", lambda s: _ms(s["ttft_s"]["p50"])),
    ("TTFT p99 (ms)", lambda s: _ms(s["ttft_s"]["p99"])),
    ("TPOT p50 (ms)", lambda s: _ms(s["tpot_s"]["p50"])),
    ("TPOT p99 (ms)", lambda s: _ms(s["tpot_s"]["p99"])),
    ("SLO attainment (%)",
     lambda s: _fmt(None if s["slo_attainment"] is None
                    else s["slo_attainment"] * 100, ".1f")),
    ("goodput (req/s)", lambda s: _fmt(s["goodput_rps"], ".2f")),
    ("output tok/s", lambda s: _fmt(s["output_tok_s"], ".1f")),
    ("finished/total",
     lambda s: f"{s['requests']['finished']}/{s['requests']['total']}"),
    ("KV transfers (count)", lambda s: _fmt(s["kv_transfer"]["count"], "d")),
    ("KV transfer bytes (MiB)",
     lambda s: _fmt(None if s["kv_transfer"]["bytes"] is None
                    else s["kv_transfer"]["bytes"] / _MIB, ".2f")),
    ("KV transfer mean (ms)", lambda s: _ms(s["kv_transfer"]["mean_s"])),
    ("KV transfer p99 (ms)", lambda s: _ms(s["kv_transfer"]["p99_s"])),
    ("compiles", _compiles_cell),
    ("leaked pages", lambda s: _fmt(s["kv_pages_leaked"], "d")),
]


# Added to the comparison once any summary holds "preemptions" (summarize_extras).
_EXTRA_ROWS: list[tuple[str, Callable[[dict], str]]] = [
    ("preemptions", lambda s: _fmt(s.get("preemptions"), "d")),
    ("rejected", lambda s: _fmt(s.get("requests", {}).get("rejected"), "d")),
]


def _compare_rows(summaries: dict[str, dict]) -> list[list[str]]:
  specs = list(_ROWS)
  if any("preemptions" in s for s in summaries.values()):
    specs += _EXTRA_ROWS
  return [[label, *(cell(s) for s in summaries.values())] for label, cell in specs]


def compare_table(summaries: dict[str, dict]) -> str:
  """One column per mode (dict order, any number of modes), one row per headline metric;
  '-' for None. Rows "preemptions" and "rejected" follow when any summary holds a
  "preemptions" key ('-' in the columns of summaries without it)."""
  header = ["metric", *summaries]
  rows = _compare_rows(summaries)
  widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

  def line(row: list[str]) -> str:
    cells = [row[0].ljust(widths[0])]
    cells += [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
    return "  ".join(cells).rstrip()

  sep = "  ".join("-" * w for w in widths)
  return "\n".join([line(header), sep, *(line(r) for r in rows)]) + "\n"


def write_compare_report(path: str, summaries: dict[str, dict],
                         benefit_rows: list[dict] | None = None, *,
                         title: str = "pdjax comparison") -> None:
  """Writes a markdown comparison: the compare table (one column per mode) and, when
  benefit_rows is given (pdjax.metrics.benefit.net_benefit), the net-benefit table."""
  lines = [f"# {title}", ""]
  modes = list(summaries)
  lines += md_table(["metric", *modes], _compare_rows(summaries)) + [""]
  slos = {m: s.get("slo") for m, s in summaries.items() if s.get("slo")}
  for mode, slo in slos.items():
    lines.append(f"- {mode}: SLO TTFT <= {_ms(slo.get('ttft_s'))} ms, TPOT <= "
                 f"{_ms(slo.get('tpot_s'))} ms, duration "
                 f"{_fmt(summaries[mode].get('duration_s'), '.2f')} s")
  if slos:
    lines.append("")
  if benefit_rows is not None:
    lines += benefit_section(benefit_rows)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    f.write("\n".join(lines))
