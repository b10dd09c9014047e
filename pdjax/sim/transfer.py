"""A simulated KV transfer in flight (SimTransfer): what the simulator's transfer functions
return, the direct one (sim.instance.sim_transfer) and the one through the host tier
(sim.host_handoff.via_host_tier).

Its own module, below both: each of them builds one, and neither needs the other to.
"""

from __future__ import annotations

from pdjax.kv.transfer_result import TransferResult


class SimTransfer:
  """A KV transfer in flight on the virtual clock, like the real engine's PendingTransfer: it
  lands at `end_s` (the driver wakes then and polls it); the pages' contents (digests) are
  copied when the landing is observed, so the source pages must still hold them then.
  src, dst: SimInstances (sim/instance.py)."""

  def __init__(self, src, src_pages: list[int], dst, dst_pages: list[int], num_bytes: float,
               seconds: float):
    self.src, self.dst, self.src_pages, self.dst_pages = src, dst, src_pages, dst_pages
    self.bytes, self.seconds = int(num_bytes), seconds
    self.end_s = src.clock.now() + seconds
    self.group_ends_s: tuple[float, ...] = ()   # a streamed one's (sim/stream_transfer.py)

  def ready(self) -> bool:
    return self.src.clock.now() >= self.end_s

  def result(self) -> TransferResult:
    self.src.clock.advance_to(self.end_s)
    for s, d in zip(self.src_pages, self.dst_pages):
      self.dst.digests[d] = self.src.digests[s]
    return TransferResult(bytes=self.bytes, seconds=self.seconds, group_ends_s=self.group_ends_s)
