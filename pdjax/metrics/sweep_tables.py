"""sweep.csv and sweep.md of `python -m pdjax.sweep`: one row per (point, run), and which points
differ beyond the noise (pure Python, no jax).

A row's metrics come from the point's run summary: one run's summary.json, or with `repeats`
N >= 2 the aggregate of its N repeats (metrics.compare.aggregate_repeats, seeds seed ..
seed+N-1). Then a metric column holds the mean over the repeats, its `<column>_hw` column the
half-width of the 95% interval (Student's t; empty with one run), and the counts (finished,
rejected, preemptions) are summed over the repeats as compare.md shows them; kv_transfers is
the mean count per repeat. sweep.md shows `mean ± hw` in the metric's column.

The "Differences" section: for each headline metric (TTFT p99, TPOT p99, SLO attainment,
goodput) and each run, the best point and, for every other point, whether it differs from the
best beyond the noise: the 95% interval of the paired per-seed difference excludes 0 (every
point runs the same seeds, so a seed's own difficulty cancels: metrics.compare.paired), or,
when the points ran on other seeds, their marginal intervals do not overlap. With several runs
per point (mode=compare) the runs of each point are compared the same way.
"""

from __future__ import annotations

import csv
import os

from pdjax.metrics import compare, intervals

# The contract columns (their names and order are kept), then what repeats added.
COLUMNS = ["point", "label", "run", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms",
           "slo_attainment", "goodput_rps", "output_tok_s", "finished", "rejected",
           "preemptions", "kv_transfers", "kv_transfer_p99_ms", "chips"]
# column: (compare.METRICS key, scale, digits); a column with "_hw" has its half-width column.
VALUES = {"ttft_p50_ms": ("ttft_p50_s", 1e3, 2), "ttft_p99_ms": ("ttft_p99_s", 1e3, 2),
          "tpot_p50_ms": ("tpot_p50_s", 1e3, 2), "tpot_p99_ms": ("tpot_p99_s", 1e3, 2),
          "slo_attainment": ("slo_attainment", 1, 4), "goodput_rps": ("goodput_rps", 1, 3),
          "output_tok_s": ("output_tok_s", 1, 1), "kv_transfers": ("kv_transfers", 1, 1),
          "kv_transfer_p99_ms": ("kv_transfer_p99_s", 1e3, 2)}
WITH_HW = ["ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "slo_attainment",
           "goodput_rps", "output_tok_s"]
COUNTS = {"finished": "finished", "rejected": "rejected", "preemptions": "preemptions"}
CSV_COLUMNS = COLUMNS + ["repeats"] + [f"{c}_hw" for c in WITH_HW]
MD_COLUMNS = COLUMNS[:3] + ["repeats"] + COLUMNS[3:]
HEADLINE = ("ttft_p99_s", "tpot_p99_s", "slo_attainment", "goodput_rps")


def _round(v: float | None, scale: float, digits: int) -> float | None:
  return None if v is None else round(scale * v, digits)


def row_of(point: int, label: str, run: str, s: dict, chips: int) -> dict:
  """One sweep row from a run's summary or its repeats' aggregate (see the module)."""
  row = {"point": point, "label": label, "run": run,
         "repeats": s["repeats"]["n"] if "repeats" in s else 1, "chips": chips}
  for col, (key, scale, digits) in VALUES.items():
    st = compare.stat(s, compare.BY_KEY[key])
    row[col] = _round(st["mean"], scale, digits)
    if col in WITH_HW:
      row[f"{col}_hw"] = _round(st["half_width"], scale, digits)
  if "repeats" not in s:   # one run: its counts as they are
    row["kv_transfers"] = s["kv_transfer"]["count"]
  for col, key in COUNTS.items():
    st = compare.stat(s, compare.BY_KEY[key])
    total = st.get("sum", st["mean"])
    row[col] = 0 if total is None else int(total)
  return row


def _md_cell(row: dict, col: str) -> str:
  v = row.get(col)
  if v is None:
    return "-"
  hw = row.get(f"{col}_hw")
  return str(v) if hw is None else f"{v} ± {hw}"


def markdown_table(rows: list[dict]) -> list[str]:
  lines = ["| " + " | ".join(MD_COLUMNS) + " |", "|" + "---|" * len(MD_COLUMNS)]
  return lines + ["| " + " | ".join(_md_cell(r, c) for c in MD_COLUMNS) + " |" for r in rows]


def write_tables(workdir: str, rows: list[dict], differences: list[str] = ()) -> None:
  """sweep.csv (CSV_COLUMNS) and sweep.md (the table, then the differences' lines)."""
  with open(os.path.join(workdir, "sweep.csv"), "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
  repeats = sorted({r["repeats"] for r in rows})
  note = ("" if repeats in ([], [1]) else
          f"repeats: {'/'.join(map(str, repeats))} per point; metric cells are mean ± half-width"
          " of the 95% interval (Student's t); finished, rejected and preemptions are summed "
          "over the repeats\n\n")
  with open(os.path.join(workdir, "sweep.md"), "w") as f:
    f.write("# Sweep\n\n" + note + "\n".join(markdown_table(rows)) + "\n")
    if differences:
      f.write("\n" + "\n".join(differences) + "\n")


def _diff_text(diff: dict, m: compare.Metric) -> str:
  return (f"{diff['mean'] * m.scale:+{m.spec}} ± {diff['half_width'] * m.scale:{m.spec}}")


def versus(summaries: dict[str, dict], m: compare.Metric) -> str | None:
  """One line: the best of the named summaries on m and, for each other, whether it differs
  beyond the noise (None when fewer than two have a value)."""
  stats = {name: compare.stat(s, m) for name, s in summaries.items()}
  known = [name for name in summaries if stats[name]["mean"] is not None]
  if len(known) < 2:
    return None
  sign = 1 if m.better == "lower" else -1
  ranked = sorted(known, key=lambda name: sign * stats[name]["mean"])
  best = ranked[0]
  beyond, within = [], []
  for other in ranked[1:]:
    diff = compare.paired(summaries[best], summaries[other], m)
    if diff is not None:
      differs = diff["lo"] > 0 or diff["hi"] < 0
      text = f"{other} ({compare.cell(summaries[other], m)}; {_diff_text(diff, m)} paired)"
    else:
      differs = intervals.differ(stats[best], stats[other])
      text = f"{other} ({compare.cell(summaries[other], m)}; marginal intervals)"
    (beyond if differs else within).append(text)
  word = "lowest" if m.better == "lower" else "highest"
  head = f"- {m.label}: {word} {best} ({compare.cell(summaries[best], m)})"
  if not beyond:
    return f"- {m.label}: all within noise: {word} {best} " \
           f"({compare.cell(summaries[best], m)}); " + ", ".join(within)
  return (head + "; beyond the noise: " + ", ".join(beyond)
          + ("; within noise: " + ", ".join(within) if within else ""))


def differences(by_point: list[tuple[str, dict[str, dict]]]) -> list[str]:
  """The "Differences" section. by_point: [(point name, {run: summary or aggregate})]."""
  if len(by_point) < 1:
    return []
  lines = ["## Differences", ""]
  ns = {s["repeats"]["n"] if "repeats" in s else 1 for _, runs in by_point for s in runs.values()}
  if min(ns) < 2:
    return lines + ["One run per point: no noise estimate, so no difference is known to exceed "
                    "the noise (set repeats >= 2)."]
  lines += ["Each line: the best point on the metric, then every other point with its paired "
            "per-seed difference from the best (mean ± 95% half-width over the seeds every "
            "point ran); beyond the noise when that interval excludes 0.", ""]
  runs = list(dict.fromkeys(run for _, r in by_point for run in r))
  for run in runs:
    at = {name: r[run] for name, r in by_point if run in r}
    body = [line for key in HEADLINE if (line := versus(at, compare.BY_KEY[key]))]
    if len(at) > 1 and body:
      lines += [f"### {run}: points", "", *body, ""]
  for name, r in by_point:
    body = [line for key in HEADLINE if (line := versus(r, compare.BY_KEY[key]))]
    if len(r) > 1 and body:
      lines += [f"### {name}: runs", "", *body, ""]
  return lines[:-1] if lines[-1] == "" else lines
