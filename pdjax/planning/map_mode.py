"""The planner's map mode: who wins where, over a grid of SLOs and workload mixes.

  python -m pdjax.plan --config=configs/where_disagg_wins.py       # plan.map=True there
  python -m pdjax.plan --config.plan.map=True --config.plan.map_mixes=sharegpt,azure_code ...

For every model (plan.map_models), hardware (plan.map_hardware) and mix (plan.map_mixes, see
pdjax.planning.mixes), the placements of map_search.map_placements on plan.chip_budget chips
are simulated at the rates map_search.walk picks, each run once, its per-request TTFT and TPOT
kept (slo_grid.RunRecord). Every (TTFT, TPOT) cell of plan.map_ttft_s x plan.map_tpot_s is then
evaluated from those arrays: per placement the highest rate meeting slo.attainment, per chip;
the best of each kind, the winner and disaggregated / best aggregated. A cell some kind meets
at the highest rate its walk reached has a lower bound, not a goodput, for it: the cell is
"unsaturated" (slo_grid.bounded), neither a win nor a tie.

A rate counts where the placement sustains it by the plain planner's rule
(slo_grid.RunRecord.meets: attainment >= the target and no latency growth over the run); runs
are placement_runs.evaluate's, as `pdjax.plan`'s, so a map and a plan of the same runs agree.
The mix `workload` (or `config`) on a trace workload offers the trace's lengths, resampled, at
Poisson rates (workload_mix.TraceLengths, written to DIR/workload_resampled.jsonl).

The walks run in a pool of plan.workers processes (planning/map_walks.py, pool.py; 0: one per
core), their runs kept in the map's order whatever the pool.

Writes DIR/map.csv, map.md (opening with what ran: backend, models, mixes, SLO grid, seed; each
mix's length percentiles above its diagrams), runs.csv, runs.npz (the per-request arrays) and
plots/map_<model>_<hardware>.png. plan.map_runs=DIR re-evaluates a previous map's runs on the
config's SLO grid and writes the same files, without simulating.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

import numpy as np

from pdjax.config import ConfigError
from pdjax.planning import (capacity, map_hybrid, map_instances, map_output, map_runs,
                            map_walks, mixes, placement_runs, workload_mix)
from pdjax.planning.map_search import Lattice, map_placements
from pdjax.planning.search import Placement
from pdjax.planning.slo_grid import HYBRID, cells


@dataclasses.dataclass
class MapSettings:
  models: list
  hardware: list
  mixes: list
  ttft_grid: list
  tpot_grid: list
  lattice: Lattice
  rate_start: float
  hybrid: list = dataclasses.field(default_factory=list)   # plan.map_hybrid's path policies


def _names(value: str, default: str) -> list[str]:
  names = [v.strip() for v in str(value).split(",") if v.strip()]
  return names or [default]


def settings(cfg) -> MapSettings:
  """The map's settings from cfg.plan; ConfigError (one line) on the first bad key."""
  from pdjax.models.llama_config import PRESETS
  from pdjax.sim.hardware import HardwareError, hardware_for
  p = cfg.plan
  models = _names(p.map_models, cfg.model.preset)
  hardware = _names(p.map_hardware, cfg.sim.hardware)
  mix_names = _names(p.map_mixes, "config")
  for name in hardware:   # a preset or a JSON file of Hardware fields
    try:
      hardware_for(name, "plan.map_hardware")
    except HardwareError as e:
      raise ConfigError(str(e)) from None
  for key, what, names, known in (("map_models", "model preset", models, PRESETS),
                                  ("map_mixes", "mix", mix_names, mixes.MIXES)):
    for name in names:
      if name not in known:
        raise ConfigError(f"plan.{key}: unknown {what} {name!r} (known: {', '.join(known)})")
  for name in mix_names:
    if mixes.longest(name) > cfg.kv.max_model_len:
      raise ConfigError(f"plan.map_mixes: mix {name!r} draws up to {mixes.longest(name)} tokens "
                        f"> kv.max_model_len={cfg.kv.max_model_len}")
  grids = []
  for key in ("map_ttft_s", "map_tpot_s"):
    values = p[key]
    if (not isinstance(values, (tuple, list)) or not values
        or not all(isinstance(v, (int, float)) and v > 0 for v in values)):
      raise ConfigError(f"plan.{key}={values!r} must be a non-empty tuple of seconds > 0")
    grids.append(sorted({float(v) for v in values}))
  if not (0 < p.map_rate_min <= p.map_rate_max and p.map_rate_factor > 1
          and p.map_rate_min <= p.map_rate_start <= p.map_rate_max):
    raise ConfigError(f"plan.map_rate_min={p.map_rate_min} <= plan.map_rate_start="
                      f"{p.map_rate_start} <= plan.map_rate_max={p.map_rate_max} (> 0) and "
                      f"plan.map_rate_factor={p.map_rate_factor} > 1 required")
  if p.map_runs and not all(os.path.isfile(os.path.join(p.map_runs, f))
                            for f in ("runs.csv", "runs.npz")):
    raise ConfigError(f"plan.map_runs={p.map_runs!r} holds no runs.csv + runs.npz of a map")
  if not placement_runs.within_bound(p, p.map_rate_min * p.chip_budget):
    raise ConfigError(f"plan.map_rate_min={p.map_rate_min:g} req/s per chip on "
                      f"{p.chip_budget} chips needs "
                      f"{placement_runs.requests_needed(p, p.map_rate_min * p.chip_budget)} "
                      f"requests > plan.max_requests_per_run={p.max_requests_per_run}: lower "
                      f"plan.map_rate_min or plan.min_duration_s")
  if p.map_tp_count < 1 or p.map_max_disagg < 0:
    raise ConfigError(f"plan.map_tp_count={p.map_tp_count} (>= 1) and plan.map_max_disagg="
                      f"{p.map_max_disagg} (>= 0) required")
  raw = str(p.get("map_hybrid", "")).strip()
  hybrid = [] if raw == "off" else [v.strip() for v in raw.split(",") if v.strip()]
  for name in hybrid:
    if name not in HYBRID and name != "instances":
      raise ConfigError(f"plan.map_hybrid: unknown path policy {name!r} (known: "
                        f"{', '.join(HYBRID)})")
  return MapSettings(models, hardware, mix_names, grids[0], grids[1],
                     Lattice(p.map_rate_min, p.map_rate_max, p.map_rate_factor),
                     float(p.map_rate_start), list(dict.fromkeys(hybrid)))


MIN_POOL_SEQS = 4   # a tier's KV must hold this many max_model_len sequences to be mapped


def roomy(c, mcfg, placement) -> bool:
  """Every tier of the placement keeps KV room for MIN_POOL_SEQS max-length sequences after
  its weights (placement_runs.fits asks for one; a tier that holds a handful only starves, e.g.
  70B at TP2 on 80 GB chips)."""
  from pdjax.sim.hardware import hardware_for
  per_seq = -(-c.kv.max_model_len // c.kv.page_size)
  return all(capacity.kv_pages(mcfg, hardware_for(c.sim.hardware), tp, page_size=c.kv.page_size,
                               dtype_bytes=2 if c.model.dtype == "bfloat16" else 4,
                               mem_util=c.plan.mem_util) >= MIN_POOL_SEQS * per_seq
             for _, _, tp in placement.tiers)


def _log(line: str) -> None:
  print(line, file=sys.stderr, flush=True)


def combo(cfg, model: str, hw: str, mix: str, workdir: str = "", lengths: bool = True):
  """(config, model config, trace lengths or None) of one model, hardware and mix (lengths:
  False skips reading a trace's rows)."""
  from pdjax import config as config_lib
  c = cfg.copy_and_resolve_references()
  c.backend, c.progress = "sim", False
  c.model.preset, c.sim.hardware = model, hw
  if cfg.plan.map_models:
    c.model.checkpoint = ""
  mixes.apply_mix(c.workload, mix)
  mcfg = config_lib.validate(c)
  path = os.path.join(workdir or ".", "workload_resampled.jsonl")
  return c, mcfg, workload_mix.trace_lengths(c, mcfg, path) if lengths else None


def simulate(cfg, s: MapSettings, runs_out: list, arrays: dict, workdir: str = "") -> dict:
  """Runs the map's walks (map_walks: in-process or in a pool of plan.workers processes);
  returns {(model, hardware, mix): [(kind, placement, chips, records, cell)]}, appends runs.csv
  rows to runs_out and arrays to `arrays`, in the map's order whatever the pool. plan.map_hybrid:
  isl_bounding and instances (stage 1) walk beside the three kinds; instances' stage 2
  (map_instances.tuned_tasks) and slo_headroom (headroom_tasks) then walk per SLO cell."""
  p = cfg.plan
  slo_cells = [(t, q) for t in s.ttft_grid for q in s.tpot_grid]
  start = s.lattice.nearest(s.rate_start)   # low: see map_search
  keys, tasks, combos, tuned = [], [], {}, {}
  for model in s.models:
    for hw in s.hardware:
      for mix in s.mixes:
        c, mcfg, trace = combo(cfg, model, hw, mix, workdir)
        cands = map_placements(p.chip_budget, p.tp_choices,
                               lambda t: placement_runs.tp_ok(mcfg, t),
                               lambda pl: (placement_runs.fits(c, mcfg, pl)
                                           and roomy(c, mcfg, pl)),
                               tp_count=p.map_tp_count,
                               full_budget=p.map_full_budget, max_disagg=p.map_max_disagg)
        splits = [pl for pl in cands if pl.run == "disaggregated"]
        if "isl_bounding" in s.hybrid:
          cands += [Placement("hybrid", pl.tiers, "isl_bounding") for pl in splits]
        inst = [] if "instances" not in s.hybrid else map_instances.placements(
            splits, max(c.scheduler.prefill_buckets),
            lambda tp, c=c: placement_runs.tier_hosts(c, tp) == 1)
        cands += inst
        _log(f"{model} {hw} {mix}: {len(cands)} placements ({len(inst)} hybrid instances)")
        keys.append((model, hw, mix))
        combos[(model, hw, mix)] = (c, mcfg, trace, splits)
        tuned[(model, hw, mix)] = (c, mcfg, trace, inst)
        tasks += [map_walks.WalkTask((model, hw, mix), c, mcfg, trace, pl, s.lattice, start,
                                     slo_cells, cfg.slo.attainment) for pl in cands]
  t0 = time.time()
  out = {key: [] for key in keys}
  map_runs.collect(tasks, map_walks.run_walks(tasks, workers(cfg)), out, runs_out, arrays)
  if "instances" in s.hybrid:
    cell_tasks = map_instances.tuned_tasks(cfg, s, out, tuned)
    _log(f"hybrid instances: {len(cell_tasks)} walks, per SLO cell taichi given the cell")
    map_runs.collect(cell_tasks, map_walks.run_walks(cell_tasks, workers(cfg)), out, runs_out,
                     arrays)
  if "slo_headroom" in s.hybrid:
    cell_tasks = map_hybrid.headroom_tasks(cfg, s, out, combos)
    _log(f"slo_headroom: {len(cell_tasks)} walks, per (model, hardware, mix, SLO cell) one "
         f"on each of up to two splits")
    map_runs.collect(cell_tasks, map_walks.run_walks(cell_tasks, workers(cfg)), out, runs_out,
                     arrays)
  _log(f"  {time.time() - t0:.0f} s")
  return out


def workers(cfg) -> int:
  """plan.workers (0, also where a config lacks the key: one process per core; 1:
  in-process)."""
  return int(cfg.plan.get("workers", 0))


def what_ran(cfg, s: MapSettings, workdir: str, command: str) -> tuple[list[str], dict]:
  """map.md's opening lines (what ran) and each mix's length-percentiles line; prints the
  `tiny` warning once when a mapped model is the toy preset."""
  from pdjax.metrics import run_info as info_lib
  backends, models, lengths, kinds = {}, {}, {}, {}
  for model in s.models:
    for hw in s.hardware:
      c, mcfg, _ = combo(cfg, model, hw, "config", workdir, lengths=False)
      backends[hw] = info_lib.describe_backend(info_lib.backend_info(c))
      if model not in models:
        models[model] = info_lib.describe_model(info_lib.model_info(c, mcfg))
        placement_runs.warn_if_tiny(c, mcfg)      # a model is seen once: one warning at most
  for mix in s.mixes:
    c, mcfg, trace = combo(cfg, s.models[0], s.hardware[0], mix, workdir)
    lengths[mix] = workload_mix.length_line(*workload_mix.mix_lengths(c, mcfg, trace))
    w = c.workload
    kinds[mix] = trace.describe() if trace else f"synthetic {w.preset}, {w.arrival} arrivals"
  p, lat = cfg.plan, s.lattice
  lines = [f"- command: `{command}`" if command else "- command: (library call)",
           f"- backend: {' | '.join(backends.values())}",
           f"- model: {' | '.join(models.values())}",
           f"- workload mixes: {'; '.join(f'{m} = {k}' for m, k in kinds.items())}; at the "
           f"lattice's rates (per chip {lat.rate_min:g} x {lat.factor:.3g}^k up to "
           f"{lat.rate(lat.k_max):.3g}); each rate >= {p.num_requests} requests and >= "
           f"{p.min_duration_s:g} s of arrivals",
           f"- SLO grid: TTFT {', '.join(f'{t:g}' for t in s.ttft_grid)} s x TPOT "
           f"{', '.join(f'{q * 1e3:g}' for q in s.tpot_grid)} ms, target "
           f"{100 * cfg.slo.attainment:g}% attainment",
           f"- seed: {cfg.seed}"]
  return lines, lengths


def run_map(cfg, workdir: str, command: str = "") -> str:
  """Simulates (or loads, plan.map_runs) and writes the map; returns the markdown summary."""
  from pdjax.planning.plan_output import rule_line
  from pdjax.sim.hardware import hardware_for
  s = settings(cfg)
  t0 = time.time()
  ran, lengths = what_ran(cfg, s, workdir, command)
  if cfg.plan.map_runs:
    by_combo, run_rows, arrays = map_runs.load(cfg.plan.map_runs)
    by_combo = {k: v for k, v in by_combo.items()       # what the settings name, if there
                if k[0] in s.models and k[1] in s.hardware and k[2] in s.mixes}
  else:
    run_rows, arrays = [], {}
    by_combo = simulate(cfg, s, run_rows, arrays, workdir)
  os.makedirs(os.path.join(workdir, "plots"), exist_ok=True)
  target = cfg.slo.attainment
  rows, blocks = [], []
  for (model, hw, mix), entries in by_combo.items():
    cs = cells(entries, s.ttft_grid, s.tpot_grid, target, factor=s.lattice.factor)
    rows += [map_output.cell_row(model, hw, mix, c) for c in cs]
    blocks.append(((model, hw, mix), cs))
  hybrid = any(row.get("path") for row in run_rows)
  inst = any(row["run"] == "hybrid" and not row.get("path") for row in run_rows)
  map_output.write_csv(os.path.join(workdir, "map.csv"), rows,
                       map_output.COLUMNS + (map_output.HYBRID_COLUMNS if hybrid else [])
                       + (map_output.INSTANCE_COLUMNS if inst else []))
  map_output.write_csv(os.path.join(workdir, "runs.csv"), run_rows, map_output.RUN_COLUMNS
                       + (map_output.HYBRID_RUN_COLUMNS if hybrid or inst else []))
  np.savez_compressed(os.path.join(workdir, "runs.npz"), **arrays)
  header = [f"# Where disaggregation wins: {cfg.plan.chip_budget} chips, "
            f"{100 * target:.0f}% SLO attainment", "", *ran,
            f"- rule: {rule_line(cfg)}",
            f"- {len(run_rows)} simulated runs (a cell's goodput is the highest lattice rate "
            f"meeting it); map written in {time.time() - t0:.0f} s",
            "- entries: winner (D disaggregated, C colocated, K chunked, = tie, - none meets "
            "the SLO) and best disaggregated / best aggregated per-chip goodput; U unsaturated: "
            "a kind met the SLO at the highest rate its walk reached (the lattice's top, or the "
            "highest whose run fits plan.max_requests_per_run), so its number is a lower bound "
            "(map.csv `unsaturated` names the kinds): not a win, a tie or a ratio"]
  if hybrid:
    header.append(map_output.hybrid_header(cfg, s.lattice.factor))
  if inst:
    header.append(map_output.instances_header(cfg, s.lattice.factor))
  titled = [(f"{m} on {h}, {x}", cs, [f"{x} {lengths[x]}"]) for (m, h, x), cs in blocks]
  map_output.write_markdown(os.path.join(workdir, "map.md"), header, titled,
                            s.ttft_grid, s.tpot_grid)
  for model in dict.fromkeys(m for m, _, _ in by_combo):
    for hw in dict.fromkeys(h for m, h, _ in by_combo if m == model):
      panels = [(x, cs) for (m, h, x), cs in blocks if (m, h) == (model, hw)]
      label = hardware_for(hw).name   # a file's own name, not its path
      map_output.plot_phase(os.path.join(workdir, "plots", f"map_{model}_{label}.png"),
                            f"{model} on {cfg.plan.chip_budget} x {label}", panels,
                            s.ttft_grid, s.tpot_grid)
  out = [*(line[2:] for line in ran)]
  for (m, h, x), cs in blocks:
    out.append(f"{m} {h} {x}: {map_output.summary_lines(cs)}")
    for line in (map_output.hybrid_line(cs), map_output.instances_line(cs)):
      if line is not None:
        out.append(f"{m} {h} {x}: {line}")
  return "\n".join(out)
