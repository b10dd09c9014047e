"""Run artifacts: config.json, requests.jsonl, summary.json and report.md (several runs side
by side: pdjax.metrics.compare)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from pdjax.metrics.report_sections import extra_sections
from pdjax.metrics.run_info import header_lines
from pdjax.request import Request

_MIB = 1024 * 1024


def _ms(seconds: float | None) -> str:
  return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def _fmt(value, spec: str) -> str:
  return "-" if value is None else format(value, spec)


EXTRA_KEYS = ("tiers", "rejects_by_reason", "preemptions", "role_switches", "kv_cache",
              "faults", "paths", "remesh_events", "kv_layer")


def _report_md(summary: dict, extras: dict | None = None) -> str:
  req, kv = summary["requests"], summary["kv_transfer"]
  slo = summary.get("slo", {})
  info = summary.get("run_info")
  lines = [f"# pdjax run: {summary['mode']}", ""]
  if info:
    lines += [f"- {line}" for line in header_lines([info])]
    lines += [f"- placement: {info['placement']['describe']} "
              f"({info['placement']['chips']} chips)", ""]
  lines += [
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
      f"{summary['goodput_rps']:.2f} req/s"
      + (f" ({summary['goodput_rps'] / info['placement']['chips']:.3f} per chip)"
         if info else "") + f"; output {summary['output_tok_s']:.1f} tok/s",
      f"- KV transfer: {kv['count']} ok ({kv['bytes'] / _MIB:.2f} MiB), "
      f"mean {_ms(kv['mean_s'])} ms, p99 {_ms(kv['p99_s'])} ms, "
      f"{kv['failures']} failed; exposed after prefill: mean "
      f"{_ms(kv.get('exposed_mean_s'))} ms, p99 {_ms(kv.get('exposed_p99_s'))} ms",
      f"- Compiles: {summary['compiles']} by XLA, "
      f"{summary.get('compiles_from_cache', 0)} served by the compilation cache",
      f"- Leaked KV pages: {summary['kv_pages_leaked']}",
      "",
  ]
  sections = {k: summary[k] for k in EXTRA_KEYS if k in summary}
  sections["num_requests"] = req["total"]
  sections.update(extras or {})
  lines += extra_sections(sections)
  if "hybrid" in summary:   # (mode=hybrid: metrics/hybrid.py)
    from pdjax.metrics.hybrid import hybrid_section
    lines += hybrid_section(summary["hybrid"])
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
  if requests is not None:
    with open(os.path.join(workdir, "requests.jsonl"), "w") as f:
      for r in requests:
        f.write(json.dumps(r.to_record()) + "\n")
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
  with open(os.path.join(workdir, "report.md"), "w") as f:
    f.write(_report_md(summary, extras))
