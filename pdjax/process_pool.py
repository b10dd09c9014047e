"""A process pool for independent host work whose results must not depend on its size: the
planner's searches (planning/pool.py) and the simulator's runs (runner/parallel_runs.py).

`workers` processes (0: one per core, os.cpu_count(); 1: in-process), results in the order the
items were given, never in the order they finish, so nothing written depends on the pool's
size. Processes are spawned (no fork of a parent that may hold threads, such as jax's). A
worker's exception is raised here with its remote traceback (concurrent.futures); the items
not yet started are cancelled.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context


def pool_size(workers: int, tasks: int) -> int:
  """`workers` (0: os.cpu_count()) capped at the number of tasks; 1: in-process."""
  return max(1, min(workers or os.cpu_count() or 1, tasks))


def run_in_order(fn: Callable, items: Sequence, workers: int, what: str = "tasks",
                 initializer: Callable | None = None, initargs: tuple = (),
                 on_done: Callable | None = None) -> list:
  """[fn(item) for item in items], in a pool of pool_size(workers, len(items)) processes (fn,
  the items and the results picklable; `initializer(*initargs)` run once in each process) or,
  with one, in-process (no initializer). on_done() is called once per finished item, in the
  order they finish (a progress bar)."""
  n = pool_size(workers, len(items))
  if n == 1:
    results = []
    for item in items:
      results.append(fn(item))
      if on_done is not None:
        on_done()
    return results
  print(f"{len(items)} {what} on {n} processes", file=sys.stderr, flush=True)
  with ProcessPoolExecutor(n, mp_context=get_context("spawn"), initializer=initializer,
                           initargs=initargs) as pool:
    futures = [pool.submit(fn, item) for item in items]
    if on_done is not None:
      for f in futures:
        f.add_done_callback(lambda _: on_done())
    try:
      return [f.result() for f in futures]
    except BaseException:
      for f in futures:
        f.cancel()
      raise
