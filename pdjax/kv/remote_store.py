"""Host tiers on several nodes (issue 32, `cluster.nodes`, `kv.remote_store`): where each
instance sits, and reloading a prefix from another node's tier when that is predicted to beat
recomputing it. Pure Python.

Instances fill the nodes in build order (prefill, then decode; or the colocated ones), each
node holding about as many: one prefill and one decode instance on two nodes are apart, as in
a P/D deployment with a node per role. Every node has its own host tier (its own store under
Ray). An instance reads its own node's tier first; what its tier lacks of a prefix may come
from another node's tier (`RemoteReload`), over the cross-node link (`kv.cross_node_gbps`,
after a round trip of `kv.cross_node_latency_s`), opened by the reader under
`kv.seal_cross_node` (the stores hold pages sealed when they were written: the writer paid the
seal then). It is taken only when round trip + bytes / link (+ opening) < the prefill time it
saves (the instance's cost model): a
reload is a bet on the link, and a slow link or a cheap prefill loses it. Measured on this
machine (benchmarks/kv_cross_node.py, BENCHMARKS.md): a 48-token reload between two Ray
nodes saved 2 ms of TTFT on the tiny model where the calibrated CPU profile predicts 25 ms:
the prediction is optimistic there.

Pages reloaded from another node are pending loads wrapped in `RemotePage` (the node they
come from): the simulator times them on the link, the Ray launcher reads them from that node's
store. The reading tier counts them (`remote_hit_pages`, `remote_declined_pages`).

A sealed page from a node's store (another node's, or the reader's own) that does not open is
read once more (a piece corrupted on its way); when it fails again the reload fails
(`RemotePagesUnread`: its prompts are computed again) and that node's tier forgets those pages
only (HostTier.discard): one corrupt read costs that reload, not the node's tier.
"""

from __future__ import annotations

import dataclasses

from pdjax.errors import ReloadFailed


class RemotePagesUnread(ReloadFailed):
  """Pages a node's store (another's, or the reader's own) served sealed that did not open,
  twice: the step did not run (its prompts start over) and that node's tier forgets them
  (`names`). args: (message, node, names), so Ray rebuilds it in the driver."""

  def __init__(self, message: str, node: int = 0, names=()):
    super().__init__(message, node, list(names))
    self.node, self.names = node, list(names)

  def __str__(self) -> str:
    return self.args[0]


def nodes_of(count: int, nodes: int) -> list[int]:
  """The node of each of `count` instances (build order) over `nodes` nodes: contiguous,
  even blocks (4 instances on 2 nodes: 0, 0, 1, 1; 2 on 2: 0, 1; 3 on 2: 0, 0, 1)."""
  if nodes < 1:
    raise ValueError(f"nodes must be >= 1, got {nodes}")
  return [k * nodes // max(count, 1) for k in range(count)]


@dataclasses.dataclass(frozen=True)
class RemotePage:
  """A pending load read from another node's tier: its payload there and that node."""
  node: int
  payload: object


@dataclasses.dataclass(frozen=True)
class CrossNodeLink:
  """The link between nodes (kv.cross_node_gbps) and, when KV is sealed (kv.seal_cross_node),
  the sealing rate (kv.seal_gbps; 0: not sealed), one pass (a seal or an open) in host memory.
  A sealed P -> D transfer is sealed on its node and opened on the other, so it also copies its
  bytes device -> host and host -> device (host_bytes_per_s: the host link). A node store's
  pages are sealed once, when written, and opened by each reload."""
  bytes_per_s: float
  seal_bytes_per_s: float = 0.0
  latency_s: float = 0.0       # per reload: the round trip to the other node's store
  host_bytes_per_s: float = float("inf")

  @property
  def sealed(self) -> bool:
    return self.seal_bytes_per_s > 0

  def seal_s(self, nbytes: float) -> float:
    """Sealing (or opening) nbytes in host memory; 0 when not sealed."""
    return nbytes / self.seal_bytes_per_s if self.sealed else 0.0

  def seconds(self, nbytes: float) -> float:
    """A P -> D transfer's bytes over the link, sealed and opened (and copied through host
    memory) when sealing is on."""
    host = 2 * nbytes / self.host_bytes_per_s if self.sealed else 0.0
    return nbytes / self.bytes_per_s + 2 * self.seal_s(nbytes) + host

  def reload_seconds(self, nbytes: float) -> float:
    """A reload's bytes from another node's store (host memory to host memory) over the
    link, opened when sealing is on (sealed when written: the writer's offload paid that)."""
    return nbytes / self.bytes_per_s + self.seal_s(nbytes)

  @classmethod
  def from_config(cls, kv, host_bytes_per_s: float = float("inf")) -> "CrossNodeLink":
    return cls(kv.get("cross_node_gbps", 100.0) * 1e9 / 8,
               kv.get("seal_gbps", 24.0) * 1e9 / 8 if kv.get("seal_cross_node", False) else 0.0,
               kv.get("cross_node_latency_s", 0.002), host_bytes_per_s)


class RemoteReload:
  """One instance's view of the other nodes' tiers: which has a prefix, and whether reading
  it from there beats recomputing it.

  recompute_s(chunks): the instance's predicted prefill time of [(new tokens, cached tokens
  before them)] (its cost model's prefill_s); page_bytes: a page's KV bytes; link: the
  CrossNodeLink."""

  def __init__(self, peers, *, recompute_s, page_bytes: int, page_size: int,
               link: CrossNodeLink):
    self.peers, self.recompute_s = list(peers), recompute_s
    self.page_bytes, self.page_size, self.link = page_bytes, page_size, link

  def reload_s(self, pages: int) -> float:
    """Predicted seconds to bring `pages` over: the store's round trip, the link, and opening
    (`CrossNodeLink.reload_seconds`)."""
    return self.link.latency_s + self.link.reload_seconds(pages * self.page_bytes)

  def find(self, names: list[bytes], salt: str, now: float):
    """(the peer tier holding the longest landed prefix of names under salt, its length);
    (None, 0) when none holds any. Ties: the first peer (lowest node)."""
    best, best_n = None, 0
    for tier in self.peers:
      if tier.lost:
        continue
      n = tier.ready_prefix(names, salt, now)
      if n > best_n:
        best, best_n = tier, n
    return best, best_n

  def saved_s(self, pages: int, start_tokens: int, prompt_tokens: int) -> float:
    """What reloading `pages` pages after start_tokens cached ones saves of the prompt's
    prefill: its predicted time from start_tokens less its time after those pages."""
    reused = start_tokens + pages * self.page_size
    return (self.recompute_s([(prompt_tokens - start_tokens, start_tokens)])
            - self.recompute_s([(prompt_tokens - reused, reused)]))

  def worth(self, pages: int, start_tokens: int, prompt_tokens: int) -> bool:
    """Whether `pages` pages after start_tokens cached tokens come faster from another node
    than the prefill they save."""
    return self.reload_s(pages) < self.saved_s(pages, start_tokens, prompt_tokens)
