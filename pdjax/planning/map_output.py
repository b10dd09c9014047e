"""The map's files: map.csv (every cell), map.md (a text phase diagram per model, hardware and
mix, and who wins how often), runs.csv (every simulated run) and one phase-diagram PNG per
model and hardware (a panel per mix). matplotlib is imported only to draw.

An unsaturated cell (slo_grid: some kind met the SLO at the highest rate its walk reached, a
lower bound) shows as U without a ratio, is counted apart from wins, ties and none, and
map.csv's `unsaturated` names the kinds whose number is a lower bound."""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Sequence

from pdjax.planning.slo_grid import HYBRID, KINDS, Cell

COLUMNS = ["model", "hardware", "mix", "ttft_s", "tpot_s",
           "colocated_per_chip", "colocated_placement", "chunked_per_chip", "chunked_placement",
           "disaggregated_per_chip", "disaggregated_placement", "winner",
           "disagg_over_aggregated", "unsaturated"]
HYBRID_COLUMNS = ["isl_bounding_per_chip", "isl_bounding_placement", "slo_headroom_per_chip",
                  "slo_headroom_placement", "slo_headroom_steps"]     # with plan.map_hybrid
INSTANCE_COLUMNS = ["hybrid_per_chip", "hybrid_placement", "hybrid_over_fixed", "hybrid_steps",
                    "best_kinds"]          # with plan.map_hybrid=instances
HYBRID_RUN_COLUMNS = ["path", "cell_ttft_s", "cell_tpot_s"]
RUN_COLUMNS = ["model", "hardware", "mix", "run", "placement", "chips", "rate_rps",
               "rate_per_chip", "requests", "attainment_loosest", "wall_s"]
COLORS = {"disaggregated": "#3b75af", "colocated": "#ef8636", "chunked": "#519e3e",
          "tie": "#c8c8c8", "none": "#ffffff", "unsaturated": "#f3e3a0"}
LETTER = {"disaggregated": "D", "colocated": "C", "chunked": "K", "tie": "=", "none": "-",
          "unsaturated": "U"}
UNSATURATED = "unsaturated (not judged: a lower bound)"


def fmt_ratio(ratio: float) -> str:
  if math.isnan(ratio):
    return ""
  return "inf" if math.isinf(ratio) else f"{ratio:.2f}"


def cell_row(model: str, hardware: str, mix: str, c: Cell) -> dict:
  row = {"model": model, "hardware": hardware, "mix": mix, "ttft_s": c.ttft_s,
         "tpot_s": c.tpot_s}
  for kind in KINDS:
    per_chip, desc = c.best[kind]
    row[f"{kind}_per_chip"] = round(per_chip, 4)
    row[f"{kind}_placement"] = desc
  row["winner"] = c.winner
  row["disagg_over_aggregated"] = fmt_ratio(c.ratio)
  row["unsaturated"] = ";".join(c.unsaturated)
  for kind in HYBRID:
    if kind in c.best:
      row[f"{kind}_per_chip"] = round(c.best[kind][0], 4)
      row[f"{kind}_placement"] = c.best[kind][1]
  if c.steps is not None:
    row["slo_headroom_steps"] = fmt_steps(c.steps)
  if c.hybrid_steps is not None:
    per_chip, desc = c.best["hybrid"]
    row.update(hybrid_per_chip=round(per_chip, 4), hybrid_placement=desc,
               hybrid_over_fixed=fmt_ratio(over_fixed(c)), hybrid_steps=fmt_steps(c.hybrid_steps),
               best_kinds=c.best_kinds)
  return row


def over_fixed(c: Cell) -> float:
  """Hybrid instances' best per-chip goodput / the best fixed kind's (nan: unsaturated, or
  neither meets the cell)."""
  h, f = c.best["hybrid"][0], max(c.best[k][0] for k in KINDS)
  if (c.hybrid_steps is not None and math.isnan(c.hybrid_steps)) or h == f == 0:
    return math.nan
  return math.inf if f == 0 else h / f


def hybrid_header(cfg, factor: float) -> str:
  """map.md's line on the hybrid splits (plan.map_hybrid=isl_bounding,slo_headroom)."""
  sc = cfg.scheduler
  return ("- hybrid (not in the winner): disaggregated splits whose decode instances may "
          f"prefill locally; isl_bounding (length_threshold {sc.length_threshold}, isl_ratio "
          f"{sc.get('isl_ratio', 0.7):g}) walked on every split, slo_headroom per SLO cell on "
          "the cell's best disaggregated split and the one with the fewest prefill chips, its "
          "steps = its per-chip goodput against the best of every other kind, in rate lattice "
          f"steps of x{factor:.3g}")


def instances_header(cfg, factor: float) -> str:
  """map.md's line on the hybrid instances (plan.map_hybrid=instances)."""
  from pdjax.planning.map_instances import chunk_pairs
  pairs = ", ".join(f"{p}/{d}" for p, d in chunk_pairs(max(cfg.scheduler.prefill_buckets)))
  return ("- hybrid instances (plan.map_hybrid=instances; not in the winner, in best_kinds): "
          "mode=hybrid, P-heavy + D-heavy instances on every disaggregated split's chips, "
          f"chunk budgets (P-heavy/D-heavy) {pairs} on each, scheduler.path=taichi given "
          f"slo.ttft_s={cfg.slo.ttft_s:g} s / slo.tpot_s={cfg.slo.tpot_s * 1e3:g} ms, then per "
          "SLO cell the cell's best given that cell; steps = its per-chip goodput against the "
          f"best fixed kind, in rate lattice steps of x{factor:.3g}")


def instances_line(cells: Sequence[Cell]) -> str | None:
  """How hybrid instances compare with the best fixed kind over a block's cells (None where
  they did not run)."""
  ran = [c for c in cells if c.hybrid_steps is not None]
  if not ran:
    return None
  judged = [c for c in ran if not math.isnan(c.hybrid_steps)]
  text = "hybrid instances vs the best of colocated, chunked, disaggregated (rate lattice steps): "
  if judged:
    within = sum(c.hybrid_steps >= -1 for c in judged)
    ahead = [c for c in judged if c.hybrid_steps >= 1]
    behind = [c for c in judged if c.hybrid_steps < -1]
    text += (f"within one step in {within}/{len(judged)} cells, ahead by >= 1 step in "
             f"{len(ahead)} ({100 * len(ahead) / len(judged):.0f}%)")
    if ahead:
      top = max(ahead, key=over_fixed)
      r = fmt_ratio(over_fixed(top))
      text += (f", by up to {'inf (only it meets)' if r == 'inf' else r + 'x'} at TTFT "
               f"{top.ttft_s:g} s / TPOT {top.tpot_s * 1e3:g} ms")
    if behind:
      worst = min(behind, key=lambda c: (c.hybrid_steps, c.ttft_s, c.tpot_s))
      text += (f"; behind by more than one in {len(behind)} (worst "
               f"{fmt_steps(worst.hybrid_steps)} at TTFT {worst.ttft_s:g} s / TPOT "
               f"{worst.tpot_s * 1e3:g} ms)")
  else:
    text += "no cell judged"
  if len(judged) < len(ran):
    text += f"; {UNSATURATED} {len(ran) - len(judged)}"
  return text


def fmt_steps(steps: float) -> str:
  if math.isnan(steps):
    return "unsaturated"
  return "inf" if steps == math.inf else "-inf" if steps == -math.inf else f"{steps:+.0f}"


def hybrid_line(cells: Sequence[Cell]) -> str | None:
  """How slo_headroom compares with the best of the other kinds over a block's cells, in
  lattice steps (None where slo_headroom did not run)."""
  ran = [c for c in cells if c.steps is not None]
  if not ran:
    return None
  judged = [c for c in ran if not math.isnan(c.steps)]    # a lower bound: not judged
  others = [k for k in (*KINDS, *HYBRID) if k != "slo_headroom" and k in ran[0].best]
  text = f"slo_headroom vs the best of {', '.join(others)} (rate lattice steps): "
  if judged:
    within = sum(c.steps >= -1 for c in judged)
    ahead = sum(c.steps >= 1 for c in judged)
    behind = [c for c in judged if c.steps < -1]
    text += (f"within one step in {within}/{len(judged)} cells, ahead by >= 1 step in {ahead} "
             f"({100 * ahead / len(judged):.0f}%)")
    if behind:
      worst = min(behind, key=lambda c: c.steps)
      text += (f"; behind by more than one in {len(behind)} (worst {fmt_steps(worst.steps)} "
               f"at TTFT {worst.ttft_s:g} s / TPOT {worst.tpot_s * 1e3:g} ms)")
  else:
    text += "no cell judged"
  if len(judged) < len(ran):
    text += f"; {UNSATURATED} {len(ran) - len(judged)}"
  return text


def steps_diagram(cells: Sequence[Cell], ttft_grid, tpot_grid, attr: str = "steps") -> list[str]:
  """A markdown table as text_diagram's: slo_headroom - the best other kind (attr "steps") or
  hybrid instances - the best fixed kind ("hybrid_steps"), in steps."""
  by = {(c.ttft_s, c.tpot_s): c for c in cells}
  lines = ["| TPOT \\ TTFT | " + " | ".join(f"{t:g} s" for t in ttft_grid) + " |",
           "|---|" + "---|" * len(ttft_grid)]
  for p in sorted(tpot_grid, reverse=True):
    lines.append(f"| {p * 1e3:g} ms | " + " | ".join(
        _steps_entry(getattr(by[(float(t), float(p))], attr)) for t in ttft_grid) + " |")
  return lines


def _steps_entry(steps: float) -> str:
  return "U" if math.isnan(steps) else fmt_steps(steps)


def write_csv(path: str, rows: Sequence[dict], columns: Sequence[str]) -> None:
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(columns))
    writer.writeheader()
    writer.writerows(rows)


def text_diagram(cells: Sequence[Cell], ttft_grid, tpot_grid) -> list[str]:
  """A markdown table: TPOT targets down (loosest first), TTFT targets across; each entry the
  winner's letter and disaggregated / best aggregated."""
  by = {(c.ttft_s, c.tpot_s): c for c in cells}
  lines = ["| TPOT \\ TTFT | " + " | ".join(f"{t:g} s" for t in ttft_grid) + " |",
           "|---|" + "---|" * len(ttft_grid)]
  for p in sorted(tpot_grid, reverse=True):
    entries = []
    for t in ttft_grid:
      c = by[(float(t), float(p))]
      r = fmt_ratio(c.ratio)
      entries.append(LETTER[c.winner] + (f" {r}" if r else ""))
    lines.append(f"| {p * 1e3:g} ms | " + " | ".join(entries) + " |")
  return lines


def summary_lines(cells: Sequence[Cell]) -> str:
  """Wins, ties and cells none meets, then the unsaturated cells, counted apart."""
  counts = {w: sum(c.winner == w for c in cells) for w in (*KINDS, "tie", "none")}
  won = [c for c in cells if c.winner == "disaggregated"]
  text = ", ".join(f"{w} {n}" for w, n in counts.items() if n)
  if won:
    top = max(won, key=lambda c: c.ratio)
    text += (f"; disaggregated's best margin {fmt_ratio(top.ratio)}x at TTFT {top.ttft_s:g} s / "
             f"TPOT {top.tpot_s * 1e3:g} ms")
  if (n := sum(c.winner == "unsaturated" for c in cells)):
    text += f"; {UNSATURATED} {n}"
  return f"cells won: {text}"


def write_markdown(path: str, header: Sequence[str],
                   blocks: Sequence[tuple[str, list[Cell], Sequence[str]]],
                   ttft_grid, tpot_grid) -> None:
  """blocks: (title, cells, notes printed under the title, e.g. the mix's lengths)."""
  lines = list(header)
  for title, cs, notes in blocks:
    lines += ["", f"## {title}", "", *notes, "", summary_lines(cs), "",
              *text_diagram(cs, ttft_grid, tpot_grid)]
    if (line := hybrid_line(cs)) is not None:
      lines += ["", line, "", *steps_diagram(cs, ttft_grid, tpot_grid)]
    if (line := instances_line(cs)) is not None:
      lines += ["", line, "", *steps_diagram(cs, ttft_grid, tpot_grid, "hybrid_steps")]
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")


def plot_phase(path: str, title: str, panels: Sequence[tuple[str, list[Cell]]],
               ttft_grid, tpot_grid) -> str:
  """One panel per mix: x TTFT target, y TPOT target (both as categories, log-spaced values),
  colour the winner, text disaggregated / best aggregated per-chip goodput."""
  import matplotlib
  matplotlib.use("Agg", force=True)
  import matplotlib.pyplot as plt
  from matplotlib.colors import ListedColormap
  from matplotlib.patches import Patch

  order = list(COLORS)
  cmap = ListedColormap([COLORS[w] for w in order])
  xs, ys = list(ttft_grid), sorted(tpot_grid)
  fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels) + 0.6, 4.2),
                           squeeze=False)
  for ax, (mix, cs) in zip(axes[0], panels):
    by = {(c.ttft_s, c.tpot_s): c for c in cs}
    grid = [[order.index(by[(float(x), float(y))].winner) for x in xs] for y in ys]
    ax.imshow(grid, cmap=cmap, vmin=0, vmax=len(order) - 1, origin="lower", aspect="auto")
    for i, y in enumerate(ys):
      for j, x in enumerate(xs):
        r = fmt_ratio(by[(float(x), float(y))].ratio)
        ax.text(j, i, r, ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(xs)), [f"{x:g}" for x in xs], fontsize=7)
    ax.set_yticks(range(len(ys)), [f"{y * 1e3:g}" for y in ys], fontsize=7)
    ax.set_xlabel("TTFT target (s)")
    ax.set_ylabel("TPOT target (ms)")
    ax.set_title(mix, fontsize=9)
  labels = {"none": "none meets the SLO", "unsaturated": "unsaturated (a lower bound)"}
  fig.legend(handles=[Patch(facecolor=COLORS[w], edgecolor="#999999",
                            label=labels.get(w, w)) for w in order],
             loc="lower center", ncol=len(order), fontsize=8, frameon=False)
  fig.suptitle(f"{title}: winner per SLO; text = best disaggregated / best aggregated "
               f"per-chip goodput", fontsize=9)
  fig.tight_layout(rect=(0, 0.07, 1, 0.95))
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path
