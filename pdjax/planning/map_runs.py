"""The map's runs as runs.csv rows and runs.npz arrays, and back (plan.map_runs re-evaluates a
previous map's runs without simulating)."""

from __future__ import annotations

import csv
import os

import numpy as np

from pdjax.planning.slo_grid import RunRecord


def collect(tasks: list, results: list, out: dict, runs_out: list, arrays: dict) -> None:
  """Each walk's runs as runs.csv rows (+ arrays) and its entry in out[key]."""
  for task, (runs, records) in zip(tasks, results):
    model, hw, mix = task.key
    pl, cell = task.placement, task.cell
    for run in runs:
      i = len(runs_out)
      arrays.update({f"r{i}_ttft": run.record.ttft, f"r{i}_tpot": run.record.tpot,
                     f"r{i}_judged": run.record.judged})
      row = {"model": model, "hardware": hw, "mix": mix, "run": pl.run,
             "placement": pl.describe(), "chips": pl.chips,
             "rate_rps": round(run.rate, 6), "rate_per_chip": round(run.per_chip, 6),
             "requests": len(run.record.ttft),
             "attainment_loosest": round(run.record.attainment(*task.slo_cells[-1]), 4),
             "wall_s": run.wall_s}
      if pl.path or cell:    # (hybrid instances: their stage-2 runs' cells)
        row.update(path=pl.path, cell_ttft_s=cell[0] if cell else "",
                   cell_tpot_s=cell[1] if cell else "")
      runs_out.append(row)
    out[task.key].append((pl.path or pl.run, pl.describe(), pl.chips,
                          [records[k] for k in sorted(records)], cell))


def load(path: str) -> tuple[dict, list, dict]:
  """A previous map's runs (DIR/runs.csv + runs.npz) as simulate() returns them."""
  import csv
  with open(os.path.join(path, "runs.csv")) as f:
    rows = list(csv.DictReader(f))
  data = np.load(os.path.join(path, "runs.npz"))
  arrays = {k: data[k] for k in data.files}
  out: dict = {}
  for i, row in enumerate(rows):
    rec = RunRecord(float(row["rate_rps"]), arrays[f"r{i}_ttft"], arrays[f"r{i}_tpot"],
                    arrays[f"r{i}_judged"])
    entries = out.setdefault((row["model"], row["hardware"], row["mix"]), [])
    kind = row.get("path") or row["run"]
    cell = ((float(row["cell_ttft_s"]), float(row["cell_tpot_s"]))
            if row.get("cell_ttft_s") else None)
    if not entries or (entries[-1][:2], entries[-1][4]) != ((kind, row["placement"]), cell):
      entries.append((kind, row["placement"], int(row["chips"]), [], cell))
    entries[-1][3].append(rec)
  return out, rows, arrays
