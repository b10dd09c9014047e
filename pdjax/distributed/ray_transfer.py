"""The transfer function of a Ray run: KV moved actor to actor, never through the driver.

`RayTransfer` (serving.serve's transfer_fn): the source actor offers the pages on its transfer
server, the destination actor pulls them (see actor.py); the driver frees the source pages when
it sees the pull acknowledged (`RemoteTransfer.ready()`), as for an in-process transfer.

Two deadlines, measured from different moments: the actor's (timeout_s from when the pull
starts there) and the driver's (that plus DEADLINE_GRACE_S from the offer's dispatch). When
the driver's passes first it frees the destination pages; the pull is then revoked on the
destination (RemoteInstance's epochs), so it is dropped there, never landed. An offer whose
pull never ran expires on its source (`offer_ttl_s`); one whose pull ran is `settle`d.
"""

from __future__ import annotations

import itertools
import random
import time

from pdjax.distributed.remote import RemoteInstance, is_ready, ray_result, wait_any
from pdjax.kv.layer_groups import group_bounds
from pdjax.kv.transfer_result import TransferResult
from pdjax.errors import DeviceError, InstanceLost, PullNotStarted

DEADLINE_GRACE_S = 5.0   # the driver gives up on a pull this long after the actor's deadline


class RemoteTransfer:
  """A pull in flight: ready() once the destination acknowledged it (or it failed, or the
  driver's own deadline passed: the destination's deadline plus DEADLINE_GRACE_S, counted from
  the offer's dispatch; the pull is then revoked on the destination, so it never lands);
  result() -> TransferResult or DeviceError. seconds: dispatch to the driver seeing it."""

  def __init__(self, pull, offer, start: float, deadline_s: float, bytes_needed: int,
               names: tuple[str, str], dst: RemoteInstance | None = None, epoch: int = 0,
               src: RemoteInstance | None = None, uuid: int = 0):
    self.pull, self.offer, self.start, self.deadline_s = pull, offer, start, deadline_s
    self.bytes_needed, self.names, self.dst, self.epoch = bytes_needed, names, dst, epoch
    self.src, self.uuid = src, uuid
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
        if self.dst is not None:      # before the driver hears of it and frees the pages
          self.dst.revoke(self.epoch, self)
    return self._seconds is not None

  def settle(self) -> None:
    """Tells the source its offer was taken by this pull (or will be): it never expires."""
    if self.src is not None and self.src.alive:
      self.src.actor.settle.remote([self.uuid])

  def settle_if_taken(self) -> None:
    """For a pull that returned after the driver gave up on it: settles its offer unless the
    pull never asked for it (dropped first, or its process died)."""
    try:
      ray_result(self.pull, self.names[1])
    except (PullNotStarted, InstanceLost):
      return
    except DeviceError:
      pass
    self.settle()

  def abandon(self) -> None:
    """The driver frees the destination pages without waiting for this pull (its request was
    dropped): a pull still out is revoked on the destination, so it is dropped there, never
    landed into pages given to another request; one that returned has its offer settled if
    it took it."""
    if is_ready(self.pull):
      self.settle_if_taken()
    elif self.dst is not None:
      self.dst.revoke(self.epoch, self)

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
    try:
      out = ray_result(self.pull, dst)
    except (PullNotStarted, InstanceLost):   # the offer was not taken: it expires
      raise
    except DeviceError:
      self.settle()
      raise
    self.settle()
    if self._seconds is None:
      self._seconds = time.perf_counter() - self.start
    self.bytes_moved = out["bytes"]
    return TransferResult(bytes=out["bytes"], seconds=self._seconds)


class RayTransfer:
  """The transfer function of a Ray run (serving.serve's transfer_fn): moves exactly the pages
  asked for from src's actor to dst's, one offer call and one pull call per transfer sent at
  once (no call per piece: each side runs one program); every pull has a deadline of
  timeout_s (cluster.pull_timeout_s, shortened to transfer_timeout_s, kv.transfer_timeout_s,
  when that is set). An offer expires on its source when no pull of it can be wanted any more:
  the deadline plus the driver's grace after it is made (`offer_ttl_s`; 35 s with the
  defaults: a 30 s pull_timeout_s, transfer_timeout_s 0)."""

  def __init__(self, timeout_s: float, transfer_timeout_s: float = 0.0):
    self.timeout_s = min(timeout_s, transfer_timeout_s) if transfer_timeout_s else timeout_s
    # (below 2**52: host_pieces.host_uuid adds a destination host in the bits above)
    self._uuids = itertools.count(random.getrandbits(32) << 20)
    self.seal_key: bytes | None = None   # the run's, when KV between nodes is sealed

  @property
  def offer_ttl_s(self) -> float:
    return self.timeout_s + DEADLINE_GRACE_S

  def __call__(self, src: RemoteInstance, src_pages: list[int], dst: RemoteInstance,
               dst_pages: list[int], tamper: bool = False) -> RemoteTransfer:
    """tamper (faults.tamper_prob): a sealed transfer's piece gets one byte flipped."""
    if len(src_pages) != len(dst_pages):
      raise ValueError(f"page counts differ: {len(src_pages)} source, {len(dst_pages)} "
                       f"destination")
    if self.seal_key is not None and src.node != dst.node:
      return self.sealed(src, src_pages, dst, dst_pages, tamper)
    return self.dispatch(src, src_pages, dst, dst_pages)

  def sealed(self, src, src_pages, dst, dst_pages, tamper: bool = False) -> RemoteTransfer:
    """Between two nodes under kv.seal_cross_node: the source actor seals the pages in host
    memory, the destination opens and writes them (distributed/sealed_kv.py); the export's
    result goes from one to the other as the import's argument, never through the driver."""
    start, uuid = time.perf_counter(), next(self._uuids)
    export = src.actor.export_sealed.remote(uuid, flat(src_pages), self.seal_key, tamper)
    dst.flush_offloads()
    epoch, pages = dst.next_epoch(), flat(dst_pages)
    pull = dst.actor.import_sealed.remote(uuid, export, pages, self.seal_key, epoch,
                                          dst.revoked())
    return RemoteTransfer(pull, export, start, self.timeout_s, len(pages) * dst.page_bytes,
                          (src.name, dst.name), dst, epoch, src, uuid)

  def dispatch(self, src, src_pages, dst, dst_pages,
               layers: tuple[int, int] | None = None) -> RemoteTransfer:
    """The offer and the pull, sent at once (pages: a list of page ids, or lists of them;
    layers: one layer group's KV only)."""
    return self.pull(src, dst, dst_pages, self.offer(src, src_pages, dst, layers), layers)

  def offer(self, src, src_pages, dst,
            layers: tuple[int, int] | None = None) -> tuple[int, object, float]:
    """The source half: (uuid, the offer call's ref, when it started)."""
    start, uuid = time.perf_counter(), next(self._uuids)
    hosts = {"dst_hosts": dst.hosts} if dst.hosts > 1 else {}   # (host_transfer.py)
    return uuid, src.actor.offer.remote(uuid, flat(src_pages), dst.tp, self.offer_ttl_s,
                                        layers, **hosts), start

  def pull(self, src, dst, dst_pages, offered: tuple[int, object, float],
           layers: tuple[int, int] | None = None) -> RemoteTransfer:
    """The destination half, for an offer made by `offer` (or one layer group's offer of a
    streamed prefill: layers=(a, b))."""
    uuid, offer, start = offered
    dst.flush_offloads()             # (pages evicted there are copied out before the pull)
    epoch = dst.next_epoch()
    pages = flat(dst_pages)
    hosts = ({"sources": (src.tp, src.hosts, src.addresses)}   # (either spans hosts)
             if src.hosts > 1 or dst.hosts > 1 else {})
    pull = dst.actor.pull.remote(uuid, src.address, pages, self.timeout_s, epoch, dst.revoked(),
                                 layers, **hosts)
    share = 1.0 if layers is None else (layers[1] - layers[0]) / dst.spec.model.num_layers
    return RemoteTransfer(pull, offer, start, self.timeout_s,
                          int(len(pages) * dst.page_bytes * share),
                          (src.name, dst.name), dst, epoch, src, uuid)

  def streamed_prefill(self, src, seqs, prev, streams):
    """src's prefill step run by layer groups (kv.stream_layers) with its streams' KV offered
    group by group by the source actor as the step runs (actor.py's `OfferStream`), and one
    pull per group sent to each decode actor at once (each waits on its transfer server for
    its offer). The step's call stands for every group's offer: a step that fails fails them.
    streams: [(decode RemoteInstance, source pages, destination pages)]. Returns the pending
    step, its `streams` a RemoteStreamedTransfer per stream."""
    bounds = group_bounds(src.spec.model.num_layers, src.opts.stream_layers)
    offers = [([next(self._uuids) for _ in bounds], flat(src_pages), dst.tp)
              for dst, src_pages, _ in streams]
    start = time.perf_counter()
    pending = src.step("prefill", seqs, prev, offers=offers, offer_ttl_s=self.offer_ttl_s)
    pending.streams = [
        RemoteStreamedTransfer([self.pull(src, dst, dst_pages, (uuid, pending.ref, start), layers)
                                for uuid, layers in zip(uuids, bounds)])
        for (dst, _, dst_pages), (uuids, _, _) in zip(streams, offers)]
    return pending


class RemoteStreamedTransfer:
  """A request's KV pulled layer group by layer group (one RemoteTransfer per group, all
  started with the step): ready once every group's pull has returned (or failed); result()
  sums their bytes (seconds: the step's dispatch to the last group seen), or raises the first
  group's failure after settling every group whose pull took its offer. A failed group fails
  the attempt: the driver retries the request's whole transfer (scheduler/streams.py)."""

  def __init__(self, groups: list[RemoteTransfer]):
    self.groups = groups

  wait_any = staticmethod(wait_any)

  def refs_to_wait(self) -> list:
    return [r for g in self.groups if not g.ready() for r in g.refs_to_wait()]

  def ready(self) -> bool:
    return all([g.ready() for g in self.groups])   # (each group checks its own deadline)

  def result(self) -> TransferResult:
    results, error = [], None
    for g in self.groups:
      try:
        results.append(g.result())
      except DeviceError as e:
        error = error or e
    if error is not None:
      raise error
    ends = tuple(r.seconds for r in results)   # (every group's pull counts from the step)
    return TransferResult(bytes=sum(r.bytes for r in results), seconds=max(ends),
                          group_ends_s=ends)

  def abandon(self) -> None:
    """The driver releases the destination pages without landing (the step failed, the
    request ended at its first token, was cancelled, or an end died): see
    RemoteTransfer.abandon, for every group."""
    for g in self.groups:
      g.abandon()


def flat(pages) -> list[int]:
  """Page ids as one list (given as one, or as a list of lists: the pieces of earlier callers)."""
  pages = list(pages)
  if pages and isinstance(pages[0], (list, tuple)):
    return [int(p) for piece in pages for p in piece]
  return [int(p) for p in pages]
