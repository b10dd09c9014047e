"""A simulated instance: the real instance's narrow interface (prefill, decode, tables), with step
durations from a cost model on a virtual clock instead of device programs.

Tokens are synthetic and deterministic (a function of the sequence position, never an EOS id),
so a simulated request runs to its max_new_tokens: traces give output lengths, not text.
"""

from __future__ import annotations

from pdjax.kv.pages import BlockTables
from pdjax.kv.transfer_result import TransferResult


class SimPending:
  """A step that completes at `end_s` on the virtual clock (a shared host may move end_s
  while the step is in flight)."""

  def __init__(self, clock, end_s: float, tokens: list[int], host=None):
    self.clock, self.end_s, self.tokens, self.host = clock, end_s, tokens, host

  def ready(self) -> bool:
    return self.clock.now() >= self.end_s

  def result(self) -> list[int]:
    self.clock.advance_to(self.end_s)   # waiting for a step moves virtual time to its end
    if self.host is not None:
      self.host.finish(self)
    return self.tokens


class SimInstance:

  def __init__(self, name: str, role: str, cost, opts, *, clock, vocab_size: int,
               eos_ids: tuple[int, ...] = (), host=None):
    """opts: the same EngineOptions the real instance takes (page geometry, buckets).
    host: a SharedHost when instances slow each other down (one CPU), else None."""
    self.name, self.role, self.cost, self.opts, self.clock = name, role, cost, opts, clock
    self.host = host
    self.last_step: SimPending | None = None
    self.tables = BlockTables(opts.num_pages, opts.page_size)
    self.tp = cost.tp
    self.compiles = 0
    self._vocab, self._eos = vocab_size, set(eos_ids)

  def _token(self, length: int) -> int:
    token = 3 + (length * 7919) % max(self._vocab - 3, 1)
    while self._eos and token in self._eos:
      token = 3 + (token + 1) % max(self._vocab - 3, 1)
    return token

  def prefill(self, seqs) -> SimPending:
    """seqs: (token_ids, start, pages, temperature, seed) as on the real instance."""
    seconds = self.cost.prefill_s([(len(ids), start) for ids, start, *_ in seqs])
    tokens = [self._token(start + len(ids)) for ids, start, *_ in seqs]
    return self._pending(seconds, tokens, "prefill")

  def decode(self, seqs) -> SimPending:
    """seqs: (last_token, position, pages, temperature, seed) as on the real instance."""
    seconds = self.cost.decode_s([pos + 1 for _, pos, *_ in seqs])
    tokens = [self._token(pos + 1) for _, pos, *_ in seqs]
    return self._pending(seconds, tokens, "decode")

  def _pending(self, seconds: float, tokens: list[int], kind: str) -> SimPending:
    pending = SimPending(self.clock, self.clock.now() + seconds, tokens, self.host)
    if self.host is not None:
      self.host.start(pending, seconds, kind)
    self.last_step = pending
    return pending

  def kv_bytes(self, num_pages: int) -> float:
    return num_pages * self.tables.page_size * self.cost.kv_bytes_per_token()


def sim_transfer(src: SimInstance, src_pages: list[int], dst: SimInstance,
                 dst_pages: list[int]):
  """The KV transfer's cost on the virtual clock (blocking, like the real engine's). A
  calibrated cost models pdjax's engine as measured: pages padded to the transfer bucket, and
  the copy queued behind the destination's step in flight (same device stream)."""
  num_bytes = src.kv_bytes(src.cost.moved_pages(len(src_pages)))
  seconds = src.cost.transfer_s(num_bytes)
  if src.cost.transfer_waits_for_destination and dst.last_step is not None:
    seconds += max(dst.last_step.end_s - src.clock.now(), 0.0)
  src.clock.advance(seconds)
  return TransferResult(bytes=int(num_bytes), seconds=seconds)


def build_sim_instances(tiers: list[tuple[str, int, int]], mcfg, opts, *, hardware: str,
                        clock, link_gbps: float = 0.0, dtype_bytes: int = 2,
                        profile: dict | None = None,
                        opts_by_role: dict | None = None) -> list[SimInstance]:
  """One SimInstance per (role, index) with the cost of its TP degree: the calibrated
  `profile`'s fit when given, else the roofline of `hardware`. Needs no devices, so a cluster
  may be larger than this machine. opts_by_role: per-tier options (e.g. KV pool sizes)."""
  from pdjax.sim.calibrated import cost_from_profile
  from pdjax.sim.hardware import HARDWARE
  from pdjax.sim.host import SharedHost
  from pdjax.sim.roofline import RooflineCost
  link = link_gbps * 1e9 / 8 if link_gbps else None
  sharing = (profile or {}).get("host_sharing")
  host = SharedHost(clock, sharing) if sharing else None
  out = []
  for role, count, tp in tiers:
    cost = (cost_from_profile(profile, tp, opts) if profile else
            RooflineCost(mcfg, HARDWARE[hardware], tp, dtype_bytes=dtype_bytes,
                         link_bytes_per_s=link))
    for i in range(count):
      out.append(SimInstance(f"{role}-{i}", role, cost, (opts_by_role or {}).get(role, opts),
                             clock=clock,
                             vocab_size=mcfg.vocab_size, eos_ids=mcfg.eos_token_ids,
                             host=host))
  return out
