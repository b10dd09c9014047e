"""Waiting for any of several in-process device results without polling them: the `wait_any`
the driver's `_block` calls when every pending object it waits on offers it (the engine's step
tokens and KV transfers; scheduler/instance_contract.py OPTIONAL_PENDING).

The driver used to poll `is_ready()` every 0.2 ms: on a host whose cores also run XLA's
threads that loop took CPU from the very step it waited for. Here a small pool of daemon
threads blocks in `block_until_ready` on each pending's arrays (which releases the GIL) and
wakes the waiting driver the moment one lands. A wait lasts at most MAX_WAIT_S, so what the
device cannot signal (a request arriving in the inbox, a timed event, a wrapped step whose
stretched end is still ahead) is seen within it.
"""

from __future__ import annotations

import concurrent.futures
import threading

import jax

MAX_WAIT_S = 0.002     # the longest one wait blocks (new requests and deadlines are seen)
_THREADS = 32          # watchers at once: every step and transfer in flight has its own

_cond = threading.Condition()
_pool = concurrent.futures.ThreadPoolExecutor(max_workers=_THREADS,
                                              thread_name_prefix="pdjax-ready")


def _watch(pending) -> None:
  try:
    for array in pending.arrays_to_wait():
      array.block_until_ready()
  except jax.errors.JaxRuntimeError:
    pass   # a failed step or transfer: the driver's own ready()/result() raises DeviceError
  except BaseException as e:  # pylint: disable=broad-except  (re-raised by wait_any)
    pending.watch_error = e   # a bug: raised on the driver's thread, not lost in this one
  finally:
    with _cond:
      pending.landed_event = True
      _cond.notify_all()


def wait_any(pendings, timeout_s: float) -> None:
  """Blocks until one of pendings lands that had not when the wait began (its arrays are
  ready, or failed on the device), or min(timeout_s, MAX_WAIT_S). A pending is watched from its
  first wait on. Anything else a watcher hit (a bug) is raised here."""
  fresh = []
  for p in pendings:
    if getattr(p, "landed_event", None) is None:
      p.landed_event = False
      _pool.submit(_watch, p)
    if not p.landed_event:
      fresh.append(p)
  with _cond:
    _cond.wait_for(lambda: any(p.landed_event for p in fresh),
                   timeout=max(0.0, min(timeout_s, MAX_WAIT_S)))
  for p in fresh:
    if getattr(p, "watch_error", None) is not None:
      raise p.watch_error
