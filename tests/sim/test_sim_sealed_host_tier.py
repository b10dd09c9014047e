"""What sealing at rest costs the simulator's host tier (issue 47, item 6; pdjax/sim/instance.py,
pdjax/kv/remote_store.py): under kv.seal_cross_node every node store holds sealed pages, so an
offload seals each page once (its copy lands that much later) and a reload opens each page
once, whether from its own node's store or another's; a remote reload no longer pays a seal
(the writer did) nor host copies beyond the instance's own. Exact seconds on a 1 GB/s link,
sealing at 2 GB/s, a 4 GB/s host link."""

import pytest

from pdjax.engine.options import EngineOptions
from pdjax.kv.host_tier import HostTier
from pdjax.kv.remote_store import CrossNodeLink, RemoteReload
from pdjax.models.llama_config import PRESETS
from pdjax.scheduler.clock import ManualClock
from pdjax.sim.hardware import HARDWARE
from pdjax.sim.instance import HOST_LATENCY_S, SimInstance
from pdjax.sim.roofline import RooflineCost

SALT = "tenant:a"
X = list(range(100, 164)) + [1]   # 4 full pages of 16 tokens


def _instance(seal_bytes_per_s: float):
  """A colocated sim instance of 8 pages whose tier (8 pages) holds X's 4 pages, offloaded
  at 0 s; r's plan reloads them at 5 s."""
  opts = EngineOptions(page_size=16, num_pages=8, max_model_len=128, prefill_buckets=(128,),
                       max_prefill_seqs=4, decode_buckets=(4,))
  inst = SimInstance("c", "colocated", RooflineCost(PRESETS["tiny"], HARDWARE["h100"], 1),
                     opts, clock=ManualClock(), vocab_size=512)
  inst.node_link = CrossNodeLink(1e9, seal_bytes_per_s=seal_bytes_per_s)
  inst.tables.enable_prefix_cache()
  tier = HostTier(8)
  inst.attach_host_tier(tier, host_bytes_per_s=4e9)
  inst.digests = dict.fromkeys(range(8), 7)
  inst.tables.allocate_prefix("x", X, len(X), SALT, 0.0)
  inst.tables.cache_computed("x", len(X), 0.0)
  inst.tables.free("x", 0.0)
  inst.tables.allocate("fill", 8 * 16)    # X's pages evicted: offloaded
  inst.tables.free("fill", 1.0)
  assert len(tier) == 4
  assert inst.tables.allocate_prefix("r", X + [7], len(X) + 1, SALT, now=5.0) == 64
  return inst, tier


@pytest.mark.parametrize("sealed", [False, True])
def test_an_offload_seals_and_a_reload_opens_each_page_once(sealed):
  inst, tier = _instance(2e9 if sealed else 0.0)
  page = inst.kv_bytes(1)
  seal = page / 2e9 if sealed else 0.0
  copy = page / 4e9 + HOST_LATENCY_S
  assert {p.ready_s for p in tier._pages.values()} == {copy + seal}
  assert inst._land_host_pages() == 4 * page / 4e9 + HOST_LATENCY_S + 4 * seal
  assert inst.host_stats["load_s"] == 4 * page / 4e9 + HOST_LATENCY_S + 4 * seal


def test_a_remote_reload_pays_the_round_trip_the_link_and_one_open():
  link = CrossNodeLink(1000.0, seal_bytes_per_s=500.0, latency_s=0.5, host_bytes_per_s=2000.0)
  assert link.reload_seconds(100) == 0.1 + 0.2
  assert CrossNodeLink(1000.0).reload_seconds(100) == 0.1
  r = RemoteReload([], recompute_s=lambda chunks: 0.0, page_bytes=50, page_size=16, link=link)
  assert r.reload_s(2) == 0.5 + 0.1 + 0.2
  assert link.seconds(100) == 0.1 + 0.4 + 0.1      # (P -> D: sealed, opened, copied twice)
