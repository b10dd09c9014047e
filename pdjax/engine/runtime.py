"""What the engine takes from the JAX runtime: its failures as `DeviceError`, whether a
program was compiled by XLA or served by a compilation cache, and compiles on a compile thread
(`compile_in_background`: XLA compiles one program while Python lowers the next).

`device_errors()` turns `jax.errors.JaxRuntimeError` (a failed dispatch, or a step whose result
failed on the device) into `DeviceError`, the one failure the driver survives; nothing else is
wrapped, so a ValueError (a shape beyond the buckets) or a TypeError still stops the run.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading

import jax
from jax import monitoring

from pdjax.errors import DeviceError

# Recorded by jax._src.compiler.compile_or_get_cached when the persistent cache serves a program.
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
# Recorded around every compile_or_get_cached call (jax._src.dispatch.BACKEND_COMPILE_EVENT):
# an XLA compile, or a persistent-cache load. Neither fires when jax's in-process cache hands
# back an executable it already holds (the same lowered program on the same devices).
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@contextlib.contextmanager
def device_errors():
  """Re-raises a JaxRuntimeError inside the block as DeviceError("JaxRuntimeError: <its
  message>") from it (the driver names the step or transfer that failed)."""
  try:
    yield
  except jax.errors.JaxRuntimeError as e:
    raise DeviceError(f"{type(e).__name__}: {e}") from e


def compile_lowered(lowered) -> tuple[object, bool]:
  """Compiles a `jax.stages.Lowered`; returns (executable, True when XLA compiled it, False
  when a compilation cache served it: the persistent one, or jax's in-process one). Lowering
  happens before (its eager ops may compile small programs of their own): only this one
  program's compile is watched, on this thread."""
  me, seen = threading.get_ident(), set()

  def on_event(event, **kwargs):
    if threading.get_ident() == me:
      seen.add(event)

  def on_duration(event, duration, **kwargs):
    on_event(event)

  monitoring.register_event_listener(on_event)
  monitoring.register_event_duration_secs_listener(on_duration)
  try:
    compiled = lowered.compile()
  finally:
    monitoring.unregister_event_listener(on_event)
    monitoring.unregister_event_duration_listener(on_duration)
  return compiled, BACKEND_COMPILE_EVENT in seen and CACHE_HIT_EVENT not in seen


# One compile thread: XLA's CPU compiles already use the cores (two concurrent compiles were
# slower than one at a time on 2 cores: benchmarks/build_time.py); the thread still lets the
# next program lower while this one compiles.
COMPILE_THREADS = 1
_COMPILERS: concurrent.futures.ThreadPoolExecutor | None = None


def _compilers() -> concurrent.futures.ThreadPoolExecutor:
  """The compile thread(s) (XLA's compile releases the GIL), made on first use."""
  global _COMPILERS
  if _COMPILERS is None:
    _COMPILERS = concurrent.futures.ThreadPoolExecutor(COMPILE_THREADS,
                                                       thread_name_prefix="pdjax-compile")
  return _COMPILERS


class CompilingProgram:
  """An executable being compiled on a compile thread: calling it waits for the compile, then
  calls the executable (later calls go straight to it). `wait()` returns the executable and
  raises what its compile raised."""

  def __init__(self, future: concurrent.futures.Future):
    self._future, self._compiled = future, None

  def wait(self):
    if self._compiled is None:
      self._compiled, _ = self._future.result()
    return self._compiled

  def __getattr__(self, name: str):
    """The executable's own attributes (as_text, cost_analysis, ...), once compiled."""
    if name.startswith("__"):
      raise AttributeError(name)
    return getattr(self.wait(), name)

  def __call__(self, *args):
    compiled = self._compiled
    if compiled is None:
      compiled = self.wait()
    return compiled(*args)


def compile_in_background(lowered, on_done) -> CompilingProgram:
  """Compiles `lowered` on a compile thread (`compile_lowered`); on_done(by_xla) runs there
  once it has compiled."""
  def work():
    compiled, by_xla = compile_lowered(lowered)
    on_done(by_xla)
    return compiled, by_xla
  return CompilingProgram(_compilers().submit(work))
