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


ALPHA = 1 - intervals.CONFIDENCE     # 0.05: the family-wise error of a conclusion line
HOLM_NOTE = (
    "- Each line picks its best mode from the data, so its differences are judged as one "
    "family: every pair of the modes it ranks (not only the best against each other: picking "
    "the best compared them all), with Holm's step-down correction holding the chance of any "
    "false \"beyond the noise\" to 5%. A difference is beyond the noise when its Holm-adjusted "
    "p < 0.05 (p from the paired t statistic over the seeds; where modes ran other seeds, the "
    "level at which their intervals stop overlapping); ± shows the unadjusted 95% interval.")


def missing(s: dict, m: Metric) -> list | None:
  """The seeds on which a summary has no value of m (no finished request to measure): a
  failure of that mode there, not a value to drop. [None] for a single run without it; None
  when every run has one."""
  if "repeats" not in s:
    return None if m.value(s) is not None else [None]
  r = s["repeats"]
  gone = [seed for seed, v in zip(r["seeds"], r["metrics"][m.key]["values"]) if v is None]
  return gone or None


def _failed_text(mode: str, seeds: list) -> str:
  if seeds == [None]:
    return f"{mode} (no value)"
  return (f"{mode} (no value on seed{'s' if len(seeds) > 1 else ''} "
          f"{', '.join(map(str, seeds))})")


def _pair_p(a: dict, b: dict, m: Metric) -> float:
  """The p-value of b - a: paired over the seeds (intervals.paired_p), else from the marginal
  intervals (intervals.overlap_p; 1.0 where either has fewer than two values)."""
  diff = paired(a, b, m)
  if diff is not None:
    return intervals.paired_p(diff)
  sa, sb = stat(a, m), stat(b, m)
  if sa["half_width"] is None or sb["half_width"] is None:
    return 1.0
  return intervals.overlap_p(sa, sb)


def _versus(summaries: dict, best: str, other: str, m: Metric,
            adjusted: float | None) -> tuple[bool | None, str]:
  """(other differs from best beyond the noise, how the difference reads). adjusted: other's
  Holm-adjusted p against best (None: the line judges one pair, by its 95% interval)."""
  diff = paired(summaries[best], summaries[other], m)
  spec = ".1f" if m.spec == "d" else m.spec
  p_text = "" if adjusted is None else (
      f"; Holm-adjusted p {'< 0.001' if adjusted < 0.001 else f'{adjusted:.3f}'}")
  if diff is not None:
    beyond = (diff["lo"] > 0 or diff["hi"] < 0) if adjusted is None else adjusted < ALPHA
    return beyond, (f"{other} ({cell(summaries[other], m)}; difference "
                    f"{diff['mean'] * m.scale:+{spec}} ± {diff['half_width'] * m.scale:{spec}} "
                    f"paired over {diff['n']} seeds{p_text})")
  st = {x: stat(summaries[x], m) for x in (best, other)}
  beyond = intervals.differ(st[best], st[other]) if adjusted is None else adjusted < ALPHA
  return beyond, f"{other} ({cell(summaries[other], m)}{p_text})"


def _holm_against(summaries: dict, ranked: list[str], m: Metric) -> dict[str, float]:
  """Each other mode's Holm-adjusted p against ranked[0], over every pair of `ranked`."""
  pairs = [(x, y) for i, x in enumerate(ranked) for y in ranked[i + 1:]]
  adjusted = intervals.holm([_pair_p(summaries[x], summaries[y], m) for x, y in pairs])
  return {y: p for (x, y), p in zip(pairs, adjusted) if x == ranked[0]}


def conclusion(summaries: dict[str, dict]) -> list[str]:
  """One line per metric with a better direction: which mode wins it and whether its lead
  over each other mode exceeds the noise. The best is picked from the data, so a line's
  comparisons are one family: every pair of the modes it ranks, p-values from the paired
  per-seed difference (repeats on the same seeds) or from the marginal intervals, Holm's
  correction across them (HOLM_NOTE opens the lines when a line may rank 3 modes or more);
  with two modes, the one difference's 95% interval (paired) or the intervals' overlap. A
  mode without a value on some seed (`missing`) failed it: it is listed as failed, never
  ranked or counted in the family."""
  modes = list(summaries)
  if len(modes) < 2:
    return []
  noisy = not all("repeats" in s and s["repeats"]["n"] >= 2 for s in summaries.values())
  lines = []
  if noisy:
    lines.append("- One run per mode: no noise estimate, so no difference below is known to "
                 "exceed the noise (set repeats >= 2).")
  elif len(modes) >= 3:
    lines.append(HOLM_NOTE)
  for m in METRICS:
    if not m.better:
      continue
    stats = {mode: stat(summaries[mode], m) for mode in modes}
    failed = {mode: gone for mode in modes if (gone := missing(summaries[mode], m))}
    known = [mode for mode in modes if mode not in failed]
    label = m.label.split(" (")[0]
    tail = ("; failed: " + ", ".join(_failed_text(x, g) for x, g in failed.items())
            if failed else "")
    if len(known) < 2:
      if len(known) == 1:
        every = "" if noisy else " on every seed"
        lines.append(f"- {label}: only {known[0]} has a value{every} "
                     f"({cell(summaries[known[0]], m)}){tail}")
      elif any(stats[x]["mean"] is not None for x in modes):
        lines.append(f"- {label}: no mode has a value on every seed: " + ", ".join(
            _failed_text(x, g) for x, g in failed.items()))
      continue
    sign = 1 if m.better == "lower" else -1
    ranked = sorted(known, key=lambda mode: sign * stats[mode]["mean"])
    best = ranked[0]
    if noisy:
      word = "lowest" if m.better == "lower" else "highest"
      lines.append(f"- {label}: {best} {word} ({cell(summaries[best], m)}); " + ", ".join(
          f"{o} ({cell(summaries[o], m)})" for o in ranked[1:]) + tail)
      continue
    adjusted = _holm_against(summaries, ranked, m) if len(ranked) >= 3 else {}
    versus = {o: _versus(summaries, best, o, m, adjusted.get(o)) for o in ranked[1:]}
    beaten = [text for beyond, text in versus.values() if beyond]
    tied = [text for beyond, text in versus.values() if not beyond]
    if not beaten:
      text = f"within noise: {best} ({cell(summaries[best], m)}), " + ", ".join(tied)
    else:
      text = (f"{best} wins ({cell(summaries[best], m)}), beyond the noise over "
              + ", ".join(beaten) + ("; within noise of " + ", ".join(tied) if tied else ""))
    lines.append(f"- {label}: {text}{tail}")
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
