"""Where a `pdjax.run` command's wall time goes, phase by phase (the simulator's speed work,
issue 29): the whole command runs in this process with its phases wrapped in timers.

  python benchmarks/sim_phases.py [pdjax.run flags, e.g. --config.backend=sim ...]

Phases (seconds, summed over every run and repeat of the command): loading the workload,
building the instances, serving (Driver.run), the end-of-run checks, the summary, and the
outputs (run files, latency and tier plots, trace.json); "other" is the rest of the command
(imports, config, the comparison table). Also prints the command's peak resident memory and
how many engine steps and state samples its runs recorded. No profiler: the timers cost a few
microseconds per phase call.
"""

from __future__ import annotations

import functools
import os
import resource
import sys
import time

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # PYTHONPATH wins

PHASES = (   # (name, module, attribute): the callables timed
    ("load workload", "pdjax.workload.loader", "load_workload"),
    ("build instances", "pdjax.runner.execute", "build_run"),
    ("serve (Driver.run)", "pdjax.scheduler.driver", "Driver.run"),
    ("end-of-run checks", "pdjax.runner.serve_requests", "check_end_state"),
    ("summary", "pdjax.runner.execute", "summarize_run"),
    ("run files", "pdjax.metrics.report", "write_run_files"),
    ("latency plot", "pdjax.metrics.plots", "plot_latency_cdfs"),
    ("tier plot", "pdjax.metrics.plots", "plot_tier_timeline"),
    ("trace.json", "pdjax.metrics.trace", "write_chrome_trace"),
)


def _wrap(totals: dict, counts: dict, name: str, fn):
  @functools.wraps(fn)
  def timed(*args, **kwargs):
    t0 = time.perf_counter()
    try:
      out = fn(*args, **kwargs)
    finally:
      totals[name] += time.perf_counter() - t0
    if name == "serve (Driver.run)":
      counts["steps"] += len(out.steps)
      counts["samples"] += len(out.samples)
    return out
  return timed


def install(totals: dict, counts: dict) -> None:
  import importlib
  for name, module, attr in PHASES:
    owner = importlib.import_module(module)
    *path, last = attr.split(".")
    for part in path:
      owner = getattr(owner, part)
    totals[name] = 0.0
    setattr(owner, last, _wrap(totals, counts, name, getattr(owner, last)))


def report(totals: dict, counts: dict, start: float, argv: list[str]) -> str:
  whole = time.perf_counter() - start
  peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  lines = [f"pdjax.run {' '.join(argv)}", f"whole command {whole:.1f} s, peak RSS "
           f"{peak_mb:,.0f} MB, {counts['steps']:,} steps and {counts['samples']:,} state "
           f"samples recorded", "| phase | s | share |", "|---|---|---|"]
  for name, seconds in totals.items():
    lines.append(f"| {name} | {seconds:.2f} | {seconds / whole:.0%} |")
  other = whole - sum(totals.values())
  lines.append(f"| other (imports, config, tables) | {other:.2f} | {other / whole:.0%} |")
  return "\n".join(lines)


def main() -> None:
  start = time.perf_counter()
  argv = sys.argv[1:]
  totals, counts = {}, {"steps": 0, "samples": 0}
  install(totals, counts)
  from pdjax import run
  sys.argv = ["pdjax.run", *argv]
  try:
    run.entry_point()
  finally:
    print(report(totals, counts, start, argv), flush=True)


if __name__ == "__main__":
  main()
