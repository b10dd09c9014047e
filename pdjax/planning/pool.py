"""The planner's process pool: independent searches (a map's walks, a plan's rate searches) in
plan.workers processes (0: one per core, os.cpu_count(); 1: in-process), results in the order
given (pdjax/process_pool.py), so nothing written depends on the pool's size.

Each process writes a trace's resampled rows (workload_mix.TraceLengths.workload) in its own
temporary folder, removed at the end.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Sequence

from pdjax import process_pool
from pdjax.planning import workload_mix
from pdjax.process_pool import pool_size

__all__ = ["pool_size", "run_in_order"]


def _start(folder: str) -> None:
  workload_mix.PRIVATE_DIR = tempfile.mkdtemp(dir=folder)


def run_in_order(fn: Callable, items: Sequence, workers: int, what: str = "searches") -> list:
  """[fn(item) for item in items], in a pool of pool_size(workers, len(items)) processes (fn and
  the items picklable) or in-process."""
  if pool_size(workers, len(items)) == 1:
    return process_pool.run_in_order(fn, items, 1)
  folder = tempfile.mkdtemp(prefix="pdjax-plan-")
  try:
    return process_pool.run_in_order(fn, items, workers, what, initializer=_start,
                                     initargs=(folder,))
  finally:
    shutil.rmtree(folder, ignore_errors=True)
