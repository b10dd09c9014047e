"""The map's hybrid kind of instances (plan.map_hybrid=instances): TaiChi-style instances that
both prefill and decode (mode=hybrid, scheduler.path=taichi; docs/guide.md "Instances that both
prefill and decode"), walked beside the three fixed kinds. Pure Python.

Candidates (`placements`): every disaggregated split the map walks (map_search.map_placements:
n_p x tp_p prefill chips + n_d x tp_d decode chips) made P-heavy x D-heavy instances, times a
star of (P-heavy, D-heavy) chunk budgets around the middle pair (`chunk_pairs`: P-heavy from
P_CHUNKS at the middle D-heavy budget, D-heavy from D_CHUNKS at the middle P-heavy budget; each
capped by the largest prefill bucket): five pairs, so five walks per split. A tier spanning
more than one host is left out (mode=hybrid runs an instance on one host).

taichi reads the SLO (its at-risk thresholds), so a run answers its cell exactly only where
the policy was given that cell's SLO. Two stages:
  1. every candidate walked as the fixed kinds are (map_search.walk, all cells), taichi given
     the config's slo.ttft_s / slo.tpot_s: a policy like any other, so each cell's rate is one
     this placement sustains there (a lower bound on what a policy given the cell would reach);
  2. `tuned_tasks`: per SLO cell, one walk of the cell's best stage-1 candidate (the best at
     the loosest cell where none meets it) with taichi given the cell's SLO, its runs
     answering that cell only, starting at the best per-chip goodput any kind reached there
     (as map_hybrid's slo_headroom walks: about two runs each). A cell equal to the config's
     SLO is skipped (stage 1 ran it).
A cell's hybrid goodput is the best of both stages."""

from __future__ import annotations

from pdjax.planning import map_walks
from pdjax.planning.search import Placement
from pdjax.planning.slo_grid import INSTANCES, cells

P_CHUNKS = (512, 1024, 2048)   # P-heavy chunk budgets (tokens per step)
D_CHUNKS = (128, 256, 512)     # D-heavy chunk budgets (smaller ones starve the decode batch:
                               #   a chunked step carries max_prefill_seqs - 1 decodes at most)


def chunk_pairs(top: int) -> list[tuple[int, int]]:
  """(P-heavy, D-heavy) chunk budgets: every P-heavy budget with the middle D-heavy one, then
  every other D-heavy budget with the middle P-heavy one; budgets over `top` (the largest
  prefill bucket) capped to it."""
  ps = sorted({min(v, top) for v in P_CHUNKS})
  ds = sorted({min(v, top) for v in D_CHUNKS})
  p_mid, d_mid = ps[len(ps) // 2], ds[len(ds) // 2]
  pairs = [(p, d_mid) for p in ps] + [(p_mid, d) for d in ds if d != d_mid]
  return list(dict.fromkeys(pairs))


def placements(splits: list[Placement], top: int, one_host) -> list[Placement]:
  """The hybrid candidates of the map's disaggregated splits (see the module docstring);
  one_host(tp): an instance of that TP fits one host."""
  out = []
  for split in splits:
    (_, n_p, tp_p), (_, n_d, tp_d) = split.tiers
    if not (one_host(tp_p) and one_host(tp_d)):
      continue
    out += [Placement(INSTANCES, (("p_heavy", n_p, tp_p), ("d_heavy", n_d, tp_d)),
                      chunks=pair) for pair in chunk_pairs(top)]
  return out


def tuned_tasks(cfg, s, out: dict, combos: dict) -> list:
  """Stage 2 (module docstring): per SLO cell of every combo, one walk of the cell's best
  hybrid candidate with taichi given the cell's SLO. combos[key] = (config, model config,
  trace, hybrid candidates)."""
  tasks = []
  config_slo = (float(cfg.slo.ttft_s), float(cfg.slo.tpot_s))
  loosest = (max(s.ttft_grid), max(s.tpot_grid))
  for key, entries in out.items():
    c, mcfg, trace, cands = combos[key]
    if not cands:
      continue
    by_desc = {pl.describe(): pl for pl in cands}
    grid = cells(entries, s.ttft_grid, s.tpot_grid, cfg.slo.attainment)
    fallback = next((x.best[INSTANCES][1] for x in grid
                     if (x.ttft_s, x.tpot_s) == loosest and x.best[INSTANCES][1]),
                    cands[0].describe())
    for cell in grid:
      where = (cell.ttft_s, cell.tpot_s)
      if where == config_slo:
        continue
      pl = by_desc[cell.best[INSTANCES][1] or fallback]
      top = max(v for v, _ in cell.best.values())
      start = s.lattice.nearest(top if top > 0 else s.rate_start)
      cc = c.copy_and_resolve_references()
      cc.slo.ttft_s, cc.slo.tpot_s = where
      tasks.append(map_walks.WalkTask(key, cc, mcfg, trace, pl, s.lattice, start, [where],
                                      cfg.slo.attainment, cell=where))
  return tasks
