"""The planner's process pool: independent searches (a map's walks, a plan's rate searches) in
plan.workers processes (0: one per core, os.cpu_count(); 1: in-process), results in the order
given, never in the order they finish, so nothing written depends on the pool's size.

Processes are spawned (no fork of a parent that may hold threads) and each writes a trace's
resampled rows (workload_mix.TraceLengths.workload) in its own temporary folder, removed at the
end. A worker's exception is raised here with its remote traceback (concurrent.futures); the
searches not yet started are cancelled.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

from pdjax.planning import workload_mix


def pool_size(workers: int, tasks: int) -> int:
  """plan.workers (0: os.cpu_count()) capped at the number of tasks; 1: in-process."""
  return max(1, min(workers or os.cpu_count() or 1, tasks))


def _start(folder: str) -> None:
  workload_mix.PRIVATE_DIR = tempfile.mkdtemp(dir=folder)


def run_in_order(fn: Callable, items: Sequence, workers: int, what: str = "searches") -> list:
  """[fn(item) for item in items], in a pool of pool_size(workers, len(items)) processes (fn and
  the items picklable) or in-process."""
  n = pool_size(workers, len(items))
  if n == 1:
    return [fn(item) for item in items]
  print(f"{len(items)} {what} on {n} processes", file=sys.stderr, flush=True)
  folder = tempfile.mkdtemp(prefix="pdjax-plan-")
  try:
    with ProcessPoolExecutor(n, mp_context=get_context("spawn"), initializer=_start,
                             initargs=(folder,)) as pool:
      futures = [pool.submit(fn, item) for item in items]
      try:
        return [f.result() for f in futures]
      except BaseException:
        for f in futures:
          f.cancel()
        raise
  finally:
    shutil.rmtree(folder, ignore_errors=True)
