"""Engine instances built once per placement within a command, released when it ends.

A command that serves many runs (mode=compare's three runs, `repeats`, a sweep's points) opens
one `InstancePool`; every run whose instances would be built the same way (same tiers, model,
parameters, engine options but for the seed, same transfer programs) takes the ones an earlier
run built, reset (`Instance.reset`: empty KV pool and page tables, the run's seed) instead of
building and compiling new ones. When the command ends, the pool drops every instance and
clears JAX's in-process caches, so nothing a command compiled outlives it (a process running
many commands, such as the test suite, does not grow with each).

Without an open pool, every run builds its own instances, which its caller owns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import sys

_OPEN: list["InstancePool"] = []


def build_key(tiers, mcfg, params, opts, opts_by_role, roles_may_change: bool) -> tuple:
  """What decides an engine run's instances and programs: the seed is not in it (it is a
  step's data, Instance.run_seed)."""
  def unseeded(o):
    return dataclasses.replace(o, seed=0)
  by_role = tuple(sorted((role, unseeded(o)) for role, o in (opts_by_role or {}).items()))
  return (tuple(tuple(t) for t in tiers), repr(mcfg), id(params), unseeded(opts), by_role,
          bool(roles_may_change))


class InstancePool:
  """Use as a context: `with InstancePool():` around a command's runs."""

  def __init__(self, max_placements: int = 2):
    """max_placements: placements held at once (mode=compare has two); building another
    releases the one used least recently (a sweep over placements holds no more)."""
    self.max_placements = max_placements
    self._held: dict[tuple, tuple[list, object]] = {}   # key -> (instances, params kept alive)
    self.builds = 0    # placements built (the rest of the runs reused them)
    self.reuses = 0

  def __enter__(self) -> "InstancePool":
    _OPEN.append(self)
    return self

  def __exit__(self, *exc) -> None:
    _OPEN.remove(self)
    self.release()

  def instances(self, key: tuple, params, build, run_seed: int) -> list:
    """The instances for `key`: those held, each reset for a run with `run_seed`, or
    `build()`'s (kept for the next run with that key)."""
    if key in self._held:
      self._held[key] = self._held.pop(key)   # most recently used last
      instances, _ = self._held[key]
      for inst in instances:
        inst.reset(run_seed)
      _return_freed_heap()
      self.reuses += 1
      return instances
    while len(self._held) >= self.max_placements:
      del self._held[next(iter(self._held))]
      self._clear()
    instances = build()
    for inst in instances:
      inst.run_seed = int(run_seed)
    self._held[key] = (instances, params)   # params held: the key names them by id
    self.builds += 1
    return instances

  def release(self) -> None:
    """Drops every instance and clears the jit caches their programs filled."""
    self._held.clear()
    self._clear()

  @staticmethod
  def _clear() -> None:
    """Frees what dropped instances leave: jax's jit and lowering caches (executables still
    held stay valid) and the cycles their programs sit in."""
    if "pdjax.engine.transfer" in sys.modules:   # (a simulated command never loaded jax)
      from pdjax.engine import programs, transfer
      for cached in (programs.step_function, transfer.gather_function,
                     transfer.scatter_function):
        cached.cache_clear()
    if "jax" in sys.modules:
      sys.modules["jax"].clear_caches()
    gc.collect()


def release_compiled_programs() -> None:
  """Drops what this process compiled and no longer references: the step and transfer
  function caches, jax's jit caches, cycles, and glibc's freed heap. For a process that builds
  engines outside any pool (a test suite, a notebook) between unrelated pieces of work."""
  InstancePool._clear()
  _return_freed_heap()


def _return_freed_heap() -> None:
  """glibc keeps freed heap pages in its arenas (one per thread that allocated: XLA's and the
  compile thread'); malloc_trim gives them back, so the last run's records and pools do not
  stay resident under the next run's. Elsewhere: nothing."""
  try:
    import ctypes
    ctypes.CDLL("libc.so.6").malloc_trim(0)
  except (OSError, AttributeError):   # not glibc
    pass


def open_pool() -> InstancePool | None:
  """The innermost pool a command opened, or None."""
  return _OPEN[-1] if _OPEN else None


@contextlib.contextmanager
def pool_scope():
  """The open pool (a sweep's, around its points' repeats), or a new one released on exit."""
  if _OPEN:
    yield _OPEN[-1]
    return
  with InstancePool() as pool:
    yield pool
