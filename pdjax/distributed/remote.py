"""The driver's side of an instance that lives in a Ray actor: the same interface as
`engine.Instance` (name, role, opts, host-side block tables, prefill/decode returning a pending
step), so the driver and the policies do not change.

A step is one actor call; its pending object is the call's Ray future: `ready()` asks Ray
without blocking (`ray.wait(timeout=0)`), `result()` fetches the tokens. Steps carry a
per-actor sequence number (the actor dispatches them in that order) and, when dispatched ahead,
the sequence number of the step whose device tokens they read.

Failures, as the driver expects them: a DeviceError raised in the actor arrives as DeviceError;
the actor's process gone (killed, crashed) arrives as `InstanceLost`; any other exception in
the actor is a bug and propagates as Ray raised it.

`RayTransfer` is the transfer function of a Ray run: the source actor offers the pages on its
transfer server, the destination actor pulls them (see actor.py); the driver frees the source
pages when it sees the pull acknowledged (`ready()`), as for an in-process transfer.
"""

from __future__ import annotations

import itertools
import random
import time

import ray

from pdjax.cli import first_and_last_line
from pdjax.engine.transfer import transfer_pieces
from pdjax.kv.pages import BlockTables
from pdjax.kv.transfer_result import TransferResult
from pdjax.scheduler.errors import DeviceError, InstanceLost

DEADLINE_GRACE_S = 5.0   # the driver gives up on a pull this long after the actor's deadline


def ray_result(ref, name: str):
  """ray.get, with the actor's expected failures as the driver's exceptions."""
  try:
    return ray.get(ref)
  except ray.exceptions.RayActorError as e:
    raise InstanceLost(f"{name}'s process is gone: {first_and_last_line(str(e))}") from e
  except ray.exceptions.RayTaskError as e:
    if isinstance(e.cause, DeviceError):
      raise DeviceError(str(e.cause)) from e
    raise


def is_ready(ref) -> bool:
  return bool(ray.wait([ref], timeout=0, fetch_local=False)[0])


def wait_any(pendings, timeout_s: float) -> None:
  """Blocks until one of the pending objects' calls has returned, or timeout_s (the driver's
  `_block`: every pending class here offers this same function)."""
  refs = [r for p in pendings for r in p.refs_to_wait()]
  if refs:
    ray.wait(refs, num_returns=1, timeout=timeout_s, fetch_local=False)


class RemotePending:
  """A step dispatched on an actor. build_s / dispatch_s: the actor's host seconds building
  and launching it (known once the result is in)."""

  def __init__(self, ref, seq: int, instance: "RemoteInstance"):
    self.ref, self.seq, self._instance = ref, seq, instance
    self.build_s = self.dispatch_s = 0.0

  wait_any = staticmethod(wait_any)

  def refs_to_wait(self) -> list:
    return [self.ref]

  def ready(self) -> bool:
    return is_ready(self.ref)

  def result(self) -> list[int]:
    out = ray_result(self.ref, self._instance.name)
    self.build_s, self.dispatch_s = out["build_s"], out["dispatch_s"]
    self._instance.counters = {k: out[k] for k in COUNTERS}
    return out["tokens"]


COUNTERS = ("compiles", "compiles_from_cache", "lazy_compiles", "lazy_compile_s")


class RemoteInstance:
  """An instance in its own process. `start` builds a fresh actor; `kill` ends its process;
  `restart` (after a kill) starts a new, empty one with the same programs."""

  device_tokens = True

  def __init__(self, spec, new_actor, warm_up_args: dict):
    self.spec, self._new_actor, self._warm_up_args = spec, new_actor, dict(warm_up_args)
    self.name, self.role, self.opts, self.tp = spec.name, spec.role, spec.opts, spec.tp
    self.tables = BlockTables(spec.opts.num_pages, spec.opts.page_size)
    self.counters = dict.fromkeys(COUNTERS, 0)
    self.actor = None
    self.alive = False

  # ---- life cycle (the launcher starts many at once: start, then finish_start) ---------------

  def start(self):
    """Creates the actor and asks it to describe itself and warm up; returns the refs."""
    self.actor, self._seq = self._new_actor(self.spec), 0
    return self.actor.describe.remote(), self.actor.warm_up.remote(**self._warm_up_args)

  def finish_start(self, refs) -> None:
    info, counters = (ray_result(r, self.name) for r in refs)
    self.address, self.pid, self.platform = info["address"], info["pid"], info["platform"]
    self.page_bytes = info["page_bytes"]
    self.overlap_by_default = info["overlap_by_default"]
    self.counters = {k: counters[k] for k in COUNTERS}
    self.alive = True

  def kill(self) -> None:
    if self.actor is not None:
      ray.kill(self.actor, no_restart=True)
    self.alive = False

  def restart(self) -> "PendingStart":
    """Starts a fresh process (its programs come from the compile cache where one is set)
    without waiting; the driver brings the instance back when the start is ready. The
    host-side tables were reset by the driver when the instance died."""
    return PendingStart(self, self.start())

  # ---- what the driver reads -----------------------------------------------------------------

  @property
  def compiles(self) -> int:
    return self.counters["compiles"]

  @property
  def compiles_from_cache(self) -> int:
    return self.counters["compiles_from_cache"]

  @property
  def lazy_compiles(self) -> int:
    return self.counters["lazy_compiles"]

  @property
  def lazy_compile_s(self) -> float:
    return self.counters["lazy_compile_s"]

  # ---- steps ---------------------------------------------------------------------------------

  def prefill(self, seqs, prev: RemotePending | None = None) -> RemotePending:
    return self._step("prefill", seqs, prev)

  def decode(self, seqs, prev: RemotePending | None = None) -> RemotePending:
    return self._step("decode", seqs, prev)

  def _step(self, kind: str, seqs, prev: RemotePending | None) -> RemotePending:
    seq, self._seq = self._seq, self._seq + 1
    ref = self.actor.step.remote(seq, kind, seqs, None if prev is None else prev.seq)
    return RemotePending(ref, seq, self)


class PendingStart:
  """An actor starting: ready() once it has described itself and warmed up; result() finishes
  the instance's start (InstanceLost if the new process died)."""

  def __init__(self, instance: RemoteInstance, refs):
    self.instance, self.refs = instance, refs

  wait_any = staticmethod(wait_any)

  def refs_to_wait(self) -> list:
    return [r for r in self.refs if not is_ready(r)]

  def ready(self) -> bool:
    return all(is_ready(r) for r in self.refs)

  def result(self) -> None:
    self.instance.finish_start(self.refs)


class RemoteTransfer:
  """A pull in flight: ready() once the destination acknowledged it (or it failed, or the
  driver's own deadline passed: the destination's deadline plus DEADLINE_GRACE_S);
  result() -> TransferResult or DeviceError. seconds: dispatch to the driver seeing it."""

  def __init__(self, pull, offer, start: float, deadline_s: float, bytes_needed: int,
               names: tuple[str, str]):
    self.pull, self.offer, self.start, self.deadline_s = pull, offer, start, deadline_s
    self.bytes_needed, self.names = bytes_needed, names
    self._seconds: float | None = None
    self._late = False

  wait_any = staticmethod(wait_any)

  def refs_to_wait(self) -> list:
    return [self.pull] + ([] if is_ready(self.offer) else [self.offer])

  def ready(self) -> bool:
    if self._seconds is None:
      now = time.perf_counter()
      if is_ready(self.pull) or (is_ready(self.offer) and self._offer_failed()):
        self._seconds = now - self.start
      elif now - self.start > self.deadline_s + DEADLINE_GRACE_S:
        self._seconds, self._late = now - self.start, True
    return self._seconds is not None

  def _offer_failed(self) -> bool:
    try:
      ray_result(self.offer, self.names[0])
    except DeviceError:
      return True
    return False

  def result(self) -> TransferResult:
    src, dst = self.names
    if self._late:
      raise DeviceError(f"KV pull {src}->{dst} not acknowledged in "
                        f"{self.deadline_s + DEADLINE_GRACE_S:g} s")
    if is_ready(self.offer):
      ray_result(self.offer, src)          # the source's failure, if it failed
    out = ray_result(self.pull, dst)
    if self._seconds is None:
      self._seconds = time.perf_counter() - self.start
    self.bytes_moved = out["bytes"]
    return TransferResult(bytes=out["bytes"], seconds=self._seconds)


class RayTransfer:
  """The transfer function of a Ray run (serving.serve's transfer_fn): moves exactly the pages
  asked for, in bucket-sized pieces, from src's actor to dst's; every pull has a deadline of
  timeout_s."""

  def __init__(self, timeout_s: float):
    self.timeout_s = timeout_s
    self._uuids = itertools.count(random.getrandbits(40) << 20)

  def __call__(self, src: RemoteInstance, src_pages: list[int], dst: RemoteInstance,
               dst_pages: list[int]) -> RemoteTransfer:
    if len(src_pages) != len(dst_pages):
      raise ValueError(f"page counts differ: {len(src_pages)} source, {len(dst_pages)} "
                       f"destination")
    return self.dispatch(src, split_pieces(src, src_pages), dst, split_pieces(src, dst_pages))

  def dispatch(self, src, src_pieces, dst, dst_pieces) -> RemoteTransfer:
    return self.pull(src, dst, dst_pieces, self.offer(src, src_pieces, dst))

  def offer(self, src, src_pieces, dst) -> tuple[int, object, float]:
    """The source half: (uuid, the offer call's ref, when it started)."""
    start, uuid = time.perf_counter(), next(self._uuids)
    return uuid, src.actor.offer.remote(uuid, src_pieces, dst.tp), start

  def pull(self, src, dst, dst_pieces, offered: tuple[int, object, float]) -> RemoteTransfer:
    """The destination half, for an offer made by `offer`."""
    uuid, offer, start = offered
    pull = dst.actor.pull.remote(uuid, src.address, dst_pieces, self.timeout_s)
    needed = sum(len(p) for p in dst_pieces) * dst.page_bytes
    return RemoteTransfer(pull, offer, start, self.timeout_s, needed, (src.name, dst.name))


def split_pieces(src: RemoteInstance, pages: list[int]) -> list[list[int]]:
  """pages cut into the transfer buckets' sizes (engine.transfer.transfer_pieces)."""
  sizes = transfer_pieces(src.opts.transfer_buckets, len(pages))
  bounds = list(itertools.accumulate([0] + sizes))
  return [list(pages[a:b]) for a, b in zip(bounds, bounds[1:])]
