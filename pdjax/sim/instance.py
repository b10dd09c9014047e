"""A simulated instance: the real instance's narrow interface (prefill, decode, tables), with step
durations from a cost model on a virtual clock instead of device programs.

Tokens are synthetic and deterministic, and they come from the simulated KV: each page holds a
digest (a rolling hash) of its sequence's tokens up to its last written slot, and the token
sampled after position p is a function of the digest through p. So a simulated request's
tokens depend on its own prompt and generated tokens and on reading the right pages: KV routed
to the wrong request, a transfer that copies the wrong pages, or a source page reused before
its transfer landed all change the tokens, as they would on the real engine. Never an EOS id,
so a simulated request runs to its max_new_tokens: traces give output lengths, not text.
"""

from __future__ import annotations

from pdjax.kv.pages import BlockTables
from pdjax.kv.remote_store import RemotePage
from pdjax.sim import decode_chain
from pdjax.sim.digest import A as _A
from pdjax.sim.digest import EMPTY as _EMPTY
from pdjax.sim.digest import MASK as _MASK
from pdjax.sim.digest import VECTOR_MIN, chain
from pdjax.sim.digest import mix as _mix
from pdjax.sim.host_handoff import via_host_tier
from pdjax.sim.stream_transfer import streamed_transfers
from pdjax.sim.transfer import SimTransfer

HOST_LATENCY_S = 1e-5   # a host copy's fixed cost where the cost model names no link latency


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
  reads_tables_at_once = True   # a step's block tables are read in the call, none kept

  streams_kv = True            # prefill(..., streams=...): KV streamed by layer groups

  def __init__(self, name: str, role: str, cost, opts, *, clock, vocab_size: int,
               eos_ids: tuple[int, ...] = (), host=None, num_layers: int = 0):
    """opts: the same EngineOptions the real instance takes (page geometry, buckets).
    host: a SharedHost when instances slow each other down (one CPU), else None.
    num_layers: the model's (layer groups' shares of a streamed transfer; 0: equal shares)."""
    self.num_layers = num_layers
    self.name, self.role, self.cost, self.opts, self.clock = name, role, cost, opts, clock
    self.host = host
    self.last_step: SimPending | None = None
    self.tables = BlockTables(opts.num_pages, opts.page_size)
    self.tp = cost.tp
    self.compiles = 0
    self._vocab, self._eos = vocab_size, set(eos_ids)
    self.digests: dict[int, int] = {}   # page -> digest of its sequence through its last slot
    self.host_bytes_per_s = 0.0          # the host link, once a host tier is attached
    self.host_page_weight = 0.0          # what reloading a page saves against recomputing it
    self.handoff = "transfer"            # or "host": P -> D through the host tier
    self.host_stats = {"offload_pages": 0, "load_pages": 0, "load_s": 0.0,
                       "remote_load_pages": 0}
    self.node, self.node_link = 0, None   # its node and the link between nodes (cluster.nodes)
    # Decode chains (pdjax/sim/decode_chain.py): many steps at once, where the cost model
    # computes many steps' times at once and no shared host moves their ends.
    self.decode_chains = hasattr(cost, "decode_s_steps") and host is None
    self.decode_floor_s = cost.decode_s_floor() if hasattr(cost, "decode_s_floor") else None

  def attach_host_tier(self, tier, host_bytes_per_s: float, handoff: str = "transfer") -> None:
    """Shares a node's host KV tier over a host link of this bandwidth (pdjax/kv/host_tier.py):
    an evicted prefix page is copied out (landing after its copy time; the step loop does not
    wait), a reloaded one is copied in before the step that needs it (the step waits).
    handoff="host": this instance's KV transfers go through the tier (sim/host_handoff.py)."""
    self.host_bytes_per_s, self.handoff = host_bytes_per_s, handoff
    self.tables.attach_host(tier, self._offload, self.role == "decode")
    recompute_s = self.cost.prefill_s([(self.tables.page_size, 0)])
    reload_s = self._host_copy_s(1) + self._seal_s(1)
    self.host_page_weight = max(0.0, 1.0 - reload_s / recompute_s)

  def _host_copy_s(self, num_pages: int) -> float:
    return (self.kv_bytes(num_pages) / self.host_bytes_per_s
            + getattr(self.cost, "link_latency_s", HOST_LATENCY_S))

  def _seal_s(self, num_pages: int) -> float:
    """Sealing (or opening) pages in host memory: under kv.seal_cross_node a node's store
    holds sealed pages (distributed/sealed_kv.py), sealed by the offload, opened by a reload."""
    return 0.0 if self.node_link is None else self.node_link.seal_s(self.kv_bytes(num_pages))

  def _offload(self, page: int, name: bytes, salt: str) -> None:
    now = self.clock.now()
    if self.tables.host.offer(name, salt, salt, self.digests[page], writer=self.name,
                              ready_s=now + self._host_copy_s(1) + self._seal_s(1), now=now):
      self.host_stats["offload_pages"] += 1

  def _land_host_pages(self) -> float:
    """Writes the host pages reloaded since the last step; returns the copy's seconds."""
    loads = self.tables.take_loads() if self.tables.pending_loads else ()
    if not loads:
      return 0.0
    remote = 0
    for page, digest in loads:
      if isinstance(digest, RemotePage):   # from another node's tier, over the link first
        digest, remote = digest.payload, remote + 1
      self.digests[page] = digest
    seconds = self._host_copy_s(len(loads)) + self._seal_s(len(loads) - remote)   # (opened)
    if remote:                     # (the link, and opening: RemoteReload.reload_s)
      seconds += self.tables.remote.reload_s(remote)
      self.host_stats["remote_load_pages"] += remote
    self.host_stats["load_pages"] += len(loads)
    self.host_stats["load_s"] += seconds
    return seconds

  def _token(self, digest: int) -> int:
    span = max(self._vocab - 3, 1)
    token = 3 + digest % span
    while self._eos and token in self._eos:
      token = 3 + (token + 1) % span
    return token

  def _write(self, ids, start: int, pages: list[int]) -> int:
    """Writes tokens ids at positions start.. of the sequence in `pages`; returns the digest
    through the last one. Reading a page no step ever wrote raises (a scheduling bug)."""
    ps = self.tables.page_size
    digest = _EMPTY if start == 0 else self.digests[pages[(start - 1) // ps]]
    if len(ids) >= VECTOR_MIN:
      return self._write_many(ids, start, pages, digest)
    pos = start
    for token in ids:
      digest = _mix(digest, token)
      if (pos + 1) % ps == 0:
        self.digests[pages[pos // ps]] = digest
      pos += 1
    if pos % ps:
      self.digests[pages[(pos - 1) // ps]] = digest
    return digest

  def _write_many(self, ids, start: int, pages: list[int], digest: int) -> int:
    """_write of a long run of tokens, the chain in numpy (pdjax/sim/digest.py)."""
    ps, n = self.tables.page_size, len(ids)
    after = chain(digest, ids)         # [j]: the digest through position start + j
    first = (ps - 1 - start) % ps      # the first j that fills a page
    for j, value in zip(range(first, n, ps), after[first::ps].tolist()):
      self.digests[pages[(start + j) // ps]] = value
    last = int(after[-1])
    if (start + n) % ps:
      self.digests[pages[(start + n - 1) // ps]] = last
    return last

  def prefill(self, seqs, prev=None, *, streams=None) -> SimPending:
    """seqs: (token_ids, start, pages, temperature, seed[, top_p]) as on the real instance
    (the sampling parameters are ignored; prev, never passed: no device tokens here).
    streams (kv.stream_layers > 0): (dst SimInstance,
    source pages, destination pages) whose KV travels layer group by layer group while the
    step computes (sim/stream_transfer.py); the result's `streams` holds their transfers."""
    seconds = self.cost.prefill_s([(len(ids), start) for ids, start, *_ in seqs])
    seconds += self._land_host_pages()
    if streams:
      if not self.opts.stream_layers:
        raise ValueError(f"{self.name}: streams given but kv.stream_layers is 0")
      seconds += (self.opts.stream_layers - 1) * getattr(self.cost, "stream_group_s", 0.0)
    tokens = [self._token(self._write(ids, start, pages)) for ids, start, pages, *_ in seqs]
    sent = streamed_transfers(self, seconds, streams, self.num_layers) if streams else None
    pending = self._pending(seconds, tokens, "prefill")
    if sent is not None:
      pending.streams = sent
    return pending

  def decode(self, seqs) -> SimPending:
    """seqs: (last_token, position, pages, temperature, seed[, top_p]) as on the real instance
    (the sampling parameters are ignored)."""
    seconds = self.cost.decode_s([pos + 1 for _, pos, *_ in seqs])
    if self.tables.pending_loads:
      seconds += self._land_host_pages()
    ps, digests, tokens = self.tables.page_size, self.digests, []
    span, eos = max(self._vocab - 3, 1), self._eos
    for tok, pos, pages, *_ in seqs:   # _write of one token and _token, inlined (the
      digest = ((_EMPTY if pos == 0 else digests[pages[(pos - 1) // ps]]) * _A + tok + 1) & _MASK
      digests[pages[pos // ps]] = digest   # simulator's hot loop: digest.mix, _token)
      token = 3 + digest % span
      tokens.append(self._token(digest) if token in eos else token)
    return self._pending(seconds, tokens, "decode")

  def chain_ends(self, batch, context_sum, start_s, max_steps, horizon_s,
                 expected=decode_chain.FIRST_CHUNK) -> list[float]:
    return decode_chain.chain_ends(self, batch, context_sum, start_s, max_steps, horizon_s,
                                   expected)

  def chain_tokens(self, last_tokens, positions, tables, steps, stops) -> tuple[list, list]:
    return decode_chain.chain_tokens(self, last_tokens, positions, tables, steps, stops)

  def write_chain(self, positions, tables, chain) -> None:
    decode_chain.write_chain(self, positions, tables, chain)

  def start_step(self, end_s: float, tokens: list[int]) -> SimPending:
    """A decode step of a chain, in flight until end_s (its digests written already)."""
    pending = SimPending(self.clock, end_s, tokens, self.host)
    self.last_step = pending
    return pending

  def _pending(self, seconds: float, tokens: list[int], kind: str) -> SimPending:
    pending = SimPending(self.clock, self.clock.now() + seconds, tokens, self.host)
    if self.host is not None:
      self.host.start(pending, seconds, kind)
    self.last_step = pending
    return pending

  def kv_bytes(self, num_pages: int) -> float:
    return num_pages * self.tables.page_size * self.cost.kv_bytes_per_token()


def sim_transfer(src: SimInstance, src_pages: list[int], dst: SimInstance,
                 dst_pages: list[int]) -> SimTransfer:
  """Dispatches the KV transfer on the virtual clock and returns at once, as the real engine's
  `transfer_kv_async` does: the loop keeps stepping every instance while it flies. A
  calibrated cost models pdjax's engine as measured: pages padded to the transfer bucket, and
  the copy queued behind the destination's step in flight (same device stream)."""
  if len(src_pages) != len(dst_pages):
    raise ValueError(f"page counts differ: {len(src_pages)} source, {len(dst_pages)} destination")
  if src.handoff == "host":
    return via_host_tier(src, src_pages, dst, dst_pages)
  num_bytes = src.kv_bytes(src.cost.moved_pages(len(src_pages)))
  if src.node != dst.node:   # between nodes: their link (and sealing), not the node's fabric
    seconds = src.node_link.seconds(num_bytes)
  else:
    seconds = src.cost.transfer_s(num_bytes)
  if src.cost.transfer_waits_for_destination and dst.last_step is not None:
    seconds += max(dst.last_step.end_s - src.clock.now(), 0.0)
  return SimTransfer(src, list(src_pages), dst, list(dst_pages), num_bytes, seconds)


def sim_cost(mcfg, tp: int, opts, *, hardware: str, link_gbps: float = 0.0,
             dtype_bytes: int = 2, profile: dict | None = None, hosts: int = 1):
  """The cost model of one instance of `tp` chips over `hosts` hosts: the calibrated
  `profile`'s fit when given (measured on one host), else the roofline of `hardware` (whose TP
  all-reduces cross the inter-host link when hosts > 1)."""
  from pdjax.sim.calibrated import cost_from_profile
  from pdjax.sim.hardware import hardware_for
  from pdjax.sim.roofline import RooflineCost
  if profile:
    return cost_from_profile(profile, tp, opts)
  link = link_gbps * 1e9 / 8 if link_gbps else None
  return RooflineCost(mcfg, hardware_for(hardware), tp, dtype_bytes=dtype_bytes,
                      link_bytes_per_s=link, hosts=hosts)


def build_sim_instances(tiers: list[tuple[str, int, int]], mcfg, opts, *, hardware: str,
                        clock, link_gbps: float = 0.0, dtype_bytes: int = 2,
                        profile: dict | None = None,
                        opts_by_role: dict | None = None,
                        hosts_by_role: dict | None = None) -> list[SimInstance]:
  """One SimInstance per (role, index) with the cost of its TP degree: the calibrated
  `profile`'s fit when given, else the roofline of `hardware`. Needs no devices, so a cluster
  may be larger than this machine. opts_by_role: per-tier options (e.g. KV pool sizes);
  hosts_by_role: the hosts each tier's instance spans (cluster.<tier>.hosts; default 1)."""
  from pdjax.sim.host import SharedHost
  sharing = (profile or {}).get("host_sharing")
  host = SharedHost(clock, sharing) if sharing else None
  out = []
  for role, count, tp in tiers:
    cost = sim_cost(mcfg, tp, opts, hardware=hardware, link_gbps=link_gbps,
                    dtype_bytes=dtype_bytes, profile=profile,
                    hosts=(hosts_by_role or {}).get(role, 1))
    for i in range(count):
      out.append(SimInstance(f"{role}-{i}", role, cost, (opts_by_role or {}).get(role, opts),
                             clock=clock,
                             vocab_size=mcfg.vocab_size, eos_ids=mcfg.eos_token_ids,
                             host=host, num_layers=mcfg.num_layers))
  return out
