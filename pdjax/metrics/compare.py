"""Several runs side by side (e.g. colocated, chunked, disaggregated): the printed table,
compare.md with a conclusion written from the numbers, and the repeats' aggregate summary.

A run's summary is either one run's summary.json or, with `repeats` > 1, the aggregate
(`aggregate_repeats`): {"mode", "run_info", "repeats": {"n", "seeds", "confidence",
"metrics": {key: intervals.interval()}}}. Cells show the value, or mean ± half-width of the
95% interval. Every table opens with what ran (run_info.header_lines) and, per column, the
placement and its chips.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from pdjax.metrics import intervals
from pdjax.metrics.report_sections import benefit_section, md_table
from pdjax.metrics.run_info import header_lines

_MIB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Metric:
  key: str                                 # repeats.metrics key (summary.json contract)
  label: str                               # the table's row
  value: Callable[[dict], float | None]    # from one run's summary
  spec: str                                # format of the shown value (after scale)
  scale: float = 1.0
  better: str = ""                         # lower | higher | "" (no winner)
  extra: bool = False                      # shown once any summary holds "preemptions"


def _get(*path):
  def read(s):
    for key in path:
      s = None if s is None else s.get(key)
    return s
  return read


def _per_chip(s: dict) -> float | None:
  chips = s.get("run_info", {}).get("placement", {}).get("chips")
  return None if not chips or s.get("goodput_rps") is None else s["goodput_rps"] / chips


METRICS: tuple[Metric, ...] = (
    Metric("ttft_p50_s", "TTFT p50 (ms)", _get("ttft_s", "p50"), ".1f", 1e3, "lower"),
    Metric("ttft_p99_s", "TTFT p99 (ms)", _get("ttft_s", "p99"), ".1f", 1e3, "lower"),
    Metric("tpot_p50_s", "TPOT p50 (ms)", _get("tpot_s", "p50"), ".1f", 1e3, "lower"),
    Metric("tpot_p99_s", "TPOT p99 (ms)", _get("tpot_s", "p99"), ".1f", 1e3, "lower"),
    Metric("slo_attainment", "SLO attainment (%)", _get("slo_attainment"), ".1f", 100,
           "higher"),
    Metric("goodput_rps", "goodput (req/s)", _get("goodput_rps"), ".2f", 1, "higher"),
    Metric("goodput_per_chip_rps", "goodput/chip (req/s)", _per_chip, ".3f"),
    Metric("output_tok_s", "output tok/s", _get("output_tok_s"), ".1f"),
    Metric("finished", "finished", _get("requests", "finished"), "d"),
    Metric("total", "total", _get("requests", "total"), "d"),
    Metric("kv_transfers", "KV transfers (count)", _get("kv_transfer", "count"), "d"),
    Metric("kv_transfer_mib", "KV transfer bytes (MiB)", _get("kv_transfer", "bytes"), ".2f",
           1 / _MIB),
    Metric("kv_transfer_mean_s", "KV transfer mean (ms)", _get("kv_transfer", "mean_s"), ".1f",
           1e3),
    Metric("kv_transfer_p99_s", "KV transfer p99 (ms)", _get("kv_transfer", "p99_s"), ".1f",
           1e3),
    Metric("kv_transfer_exposed_p99_s", "KV transfer exposed p99 (ms)",
           _get("kv_transfer", "exposed_p99_s"), ".1f", 1e3),
    Metric("compiles", "compiles", _get("compiles"), "d"),
    Metric("compiles_from_cache", "compiles cached", _get("compiles_from_cache"), "d"),
    Metric("kv_pages_leaked", "leaked pages", _get("kv_pages_leaked"), "d"),
    Metric("preemptions", "preemptions", _get("preemptions"), "d", extra=True),
    Metric("rejected", "rejected", _get("requests", "rejected"), "d", extra=True),
)
BY_KEY = {m.key: m for m in METRICS}
# Counts summed over repeats (shown as one number, not an interval).
SUMMED = ("finished", "total", "compiles", "compiles_from_cache", "kv_pages_leaked",
          "preemptions", "rejected")


def aggregate_repeats(run: str, summaries: list[dict], seeds: list[int]) -> dict:
  """The <mode>/summary.json of N repeats: run_info (seed: the list), and every metric's
  values, mean and 95% interval (counts in SUMMED also summed)."""
  metrics = {}
  for m in METRICS:
    values = [m.value(s) for s in summaries]
    metrics[m.key] = intervals.interval(values)
    if m.key in SUMMED:
      metrics[m.key]["sum"] = sum(v for v in values if v is not None)
  info = dict(summaries[0].get("run_info", {}))
  if info:
    info["seed"] = list(seeds)
  return {"mode": run, "run_info": info,
          "repeats": {"n": len(summaries), "seeds": list(seeds),
                      "confidence": intervals.CONFIDENCE, "metrics": metrics}}


def stat(s: dict, m: Metric) -> dict:
  """The metric of one summary as an interval (n = 1 for a single run)."""
  if "repeats" in s:
    return s["repeats"]["metrics"][m.key]
  return intervals.interval([m.value(s)])


def _shown(value: float | None, m: Metric, spec: str | None = None) -> str:
  spec = spec or m.spec
  if value is None:
    return "-"
  return format(int(value) if spec == "d" else value * m.scale, spec)


def cell(s: dict, m: Metric) -> str:
  """One summary's value of m, or its repeats' mean ± half-width (a count: its sum)."""
  if "repeats" not in s:
    return _shown(m.value(s), m)
  st = s["repeats"]["metrics"][m.key]
  if m.key in SUMMED:
    return _shown(st["sum"], m)
  spec = ".1f" if m.spec == "d" else m.spec     # a mean count is not whole
  if st["half_width"] is None:
    return _shown(st["mean"], m, spec)
  return f"{_shown(st['mean'], m, spec)} ± {_shown(st['half_width'], m, spec)}"


def _rows(summaries: dict[str, dict]) -> list[list[str]]:
  cols = list(summaries.values())
  rows = []
  if all(s.get("run_info") for s in cols):
    rows.append(["placement", *(s["run_info"]["placement"]["describe"] for s in cols)])
    rows.append(["chips", *(str(s["run_info"]["placement"]["chips"]) for s in cols)])
  extras = any("preemptions" in s or "preemptions" in s.get("repeats", {}).get("metrics", {})
               and s["repeats"]["metrics"]["preemptions"]["n"] for s in cols)
  for m in METRICS:
    if m.key in ("finished", "total", "compiles", "compiles_from_cache"):
      continue
    if m.extra and not extras:
      continue
    if m.key == "goodput_per_chip_rps" and not all(s.get("run_info") for s in cols):
      continue
    rows.append([m.label, *(cell(s, m) for s in cols)])
    if m.key == "output_tok_s":
      rows.append(["finished/total", *(f"{cell(s, BY_KEY['finished'])}/"
                                       f"{cell(s, BY_KEY['total'])}" for s in cols)])
    if m.key == "kv_transfer_exposed_p99_s":
      rows.append(["compiles", *(_compiles_cell(s) for s in cols)])
  return rows


def _compiles_cell(s: dict) -> str:
  """XLA compiles, then "(+N cached)" when a compilation cache served N programs."""
  cached = cell(s, BY_KEY["compiles_from_cache"])
  return cell(s, BY_KEY["compiles"]) + (f" (+{cached} cached)" if cached not in ("0", "-")
                                        else "")


def _infos(summaries: dict[str, dict]) -> list[dict]:
  return [s["run_info"] for s in summaries.values() if s.get("run_info")]


def _repeat_line(summaries: dict[str, dict]) -> str | None:
  ns = {s["repeats"]["n"] for s in summaries.values() if "repeats" in s}
  if not ns:
    return None
  return (f"repeats: {'/'.join(map(str, sorted(ns)))} per mode; cells are mean ± half-width "
          f"of the 95% interval (Student's t)")


def compare_table(summaries: dict[str, dict]) -> str:
  """What ran (when the summaries carry run_info), then one column per mode (dict order), one
  row per headline metric; '-' for None. Rows "preemptions" and "rejected" follow when any
  summary holds "preemptions"."""
  header = ["metric", *summaries]
  rows = _rows(summaries)
  widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

  def line(row: list[str]) -> str:
    cells = [row[0].ljust(widths[0])]
    cells += [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
    return "  ".join(cells).rstrip()

  sep = "  ".join("-" * w for w in widths)
  head = header_lines(_infos(summaries)) if _infos(summaries) else []
  if (rl := _repeat_line(summaries)):
    head.append(rl)
  return "\n".join([*head, *([""] if head else []), line(header), sep,
                    *(line(r) for r in rows)]) + "\n"


def table_rows(text: str) -> list[str]:
  """The metric names, in order, of the first table `compare_table` printed in `text` (the
  column under "metric", as wide as the dashes below it)."""
  lines = text.splitlines()
  at = next(i for i, line in enumerate(lines) if line.startswith("metric "))
  width = len(lines[at + 1].split(" ")[0])
  rows = []
  for line in lines[at + 2:]:
    if not line.strip() or line.startswith("```"):   # (the end of a markdown code block)
      break
    rows.append(line[:width].strip())
  return rows


def paired(a: dict, b: dict, m: Metric) -> dict | None:
  """The interval of b - a over repeats run on the same seeds (each repeat of both modes
  served the same workload, so a seed's own difficulty cancels); None when they were not."""
  ra, rb = a.get("repeats"), b.get("repeats")
  if not ra or not rb or ra["seeds"] != rb["seeds"] or ra["n"] < 2:
    return None
    # (a single run, or repeats on other seeds: only the marginal intervals can be compared)
  va, vb = ra["metrics"][m.key]["values"], rb["metrics"][m.key]["values"]
  if None in va or None in vb:
    return None
  return intervals.interval([y - x for x, y in zip(va, vb)])


def _versus(summaries: dict, best: str, other: str, m: Metric) -> tuple[bool | None, str]:
  """(other differs from best beyond the noise, how the difference reads)."""
  diff = paired(summaries[best], summaries[other], m)
  spec = ".1f" if m.spec == "d" else m.spec
  if diff is not None:
    beyond = diff["lo"] > 0 or diff["hi"] < 0
    return beyond, (f"{other} ({cell(summaries[other], m)}; difference "
                    f"{diff['mean'] * m.scale:+{spec}} ± {diff['half_width'] * m.scale:{spec}} "
                    f"paired over {diff['n']} seeds)")
  st = {x: stat(summaries[x], m) for x in (best, other)}
  return intervals.differ(st[best], st[other]), f"{other} ({cell(summaries[other], m)})"


def conclusion(summaries: dict[str, dict]) -> list[str]:
  """One line per metric with a better direction: which mode wins it and whether its lead
  over each other mode exceeds the noise: the 95% interval of the paired per-seed difference
  excludes 0 (repeats on the same seeds), else the modes' 95% intervals do not overlap."""
  modes = list(summaries)
  if len(modes) < 2:
    return []
  noisy = not all("repeats" in s and s["repeats"]["n"] >= 2 for s in summaries.values())
  lines = []
  if noisy:
    lines.append("- One run per mode: no noise estimate, so no difference below is known to "
                 "exceed the noise (set repeats >= 2).")
  for m in METRICS:
    if not m.better:
      continue
    stats = {mode: stat(summaries[mode], m) for mode in modes}
    known = [mode for mode in modes if stats[mode]["mean"] is not None]
    if len(known) < 2:
      continue
    sign = 1 if m.better == "lower" else -1
    ranked = sorted(known, key=lambda mode: sign * stats[mode]["mean"])
    best, label = ranked[0], m.label.split(" (")[0]
    if noisy:
      word = "lowest" if m.better == "lower" else "highest"
      lines.append(f"- {label}: {best} {word} ({cell(summaries[best], m)}); " + ", ".join(
          f"{o} ({cell(summaries[o], m)})" for o in ranked[1:]))
      continue
    versus = {o: _versus(summaries, best, o, m) for o in ranked[1:]}
    beaten = [text for beyond, text in versus.values() if beyond]
    tied = [text for beyond, text in versus.values() if not beyond]
    if not beaten:
      text = f"within noise: {best} ({cell(summaries[best], m)}), " + ", ".join(tied)
    else:
      text = (f"{best} wins ({cell(summaries[best], m)}), beyond the noise over "
              + ", ".join(beaten) + ("; within noise of " + ", ".join(tied) if tied else ""))
    lines.append(f"- {label}: {text}")
  return lines


def write_compare_report(path: str, summaries: dict[str, dict],
                         benefit_rows: list[dict] | None = None, *,
                         title: str = "pdjax comparison") -> None:
  """Writes a markdown comparison: what ran, the conclusion, the compare table (one column
  per mode) and, when benefit_rows is given (pdjax.metrics.benefit.net_benefit), the
  net-benefit table."""
  lines = [f"# {title}", ""]
  infos = _infos(summaries)
  if infos:
    lines += [f"- {line}" for line in header_lines(infos)]
  if (rl := _repeat_line(summaries)):
    lines.append(f"- {rl}")
  if len(lines) > 2:
    lines.append("")
  if (concl := conclusion(summaries)):
    lines += ["## Conclusion", "", *concl, ""]
  modes = list(summaries)
  lines += md_table(["metric", *modes], _rows(summaries)) + [""]
  for mode, s in summaries.items():
    slo = s.get("slo") or s.get("run_info", {}).get("slo")
    if slo and "duration_s" in s:
      lines.append(f"- {mode}: SLO TTFT <= {_shown(slo.get('ttft_s'), BY_KEY['ttft_p50_s'])} "
                   f"ms, TPOT <= {_shown(slo.get('tpot_s'), BY_KEY['ttft_p50_s'])} ms, "
                   f"duration {s['duration_s']:.2f} s")
  if lines[-1]:
    lines.append("")
  if benefit_rows is not None:
    lines += benefit_section(benefit_rows)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    f.write("\n".join(lines))
