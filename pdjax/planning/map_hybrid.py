"""The map's hybrid kind scored with slo_headroom: one walk per SLO cell (map_mode.simulate runs
them after every SLO-independent walk, whose cells choose each walk's split and start).
Pure Python."""

from __future__ import annotations

from pdjax.planning import map_walks
from pdjax.planning.search import Placement
from pdjax.planning.slo_grid import cells


def headroom_tasks(cfg, s, out: dict, combos: dict) -> list:
  """slo_headroom's walks, per SLO cell of every combo: its path choices read the SLO, so a
  run answers its own cell only. Two splits per cell, made hybrid: the cell's best
  disaggregated split (disaggregation plus local prefill where it has headroom) and the
  split with the fewest prefill chips (decode instances doing most prefills, a small prefill
  tier taking what would stall them), one where they coincide or none meets the cell. Each
  walk starts at the best per-chip goodput any other kind reached in that cell (the map's
  start where none did), so a walk costs about two runs: the question is whether
  slo_headroom is steps above or below the best of the rest, not its whole rate curve."""
  tasks = []
  for key, entries in out.items():
    c, mcfg, trace, splits = combos[key]
    if not splits:
      continue
    by_desc = {pl.describe(): pl for pl in splits}
    for cell in cells(entries, s.ttft_grid, s.tpot_grid, cfg.slo.attainment):
      best = by_desc.get(cell.best["disaggregated"][1], splits[0])
      best_other = max(v for v, _ in cell.best.values())
      start = s.lattice.nearest(best_other if best_other > 0 else s.rate_start)
      cc = c.copy_and_resolve_references()
      cc.slo.ttft_s, cc.slo.tpot_s = cell.ttft_s, cell.tpot_s
      where = (cell.ttft_s, cell.tpot_s)
      for split in dict.fromkeys([best, splits[0]]):
        tasks.append(map_walks.WalkTask(key, cc, mcfg, trace,
                                        Placement("hybrid", split.tiers, "slo_headroom"),
                                        s.lattice, start, [where], cfg.slo.attainment,
                                        cell=where))
  return tasks
