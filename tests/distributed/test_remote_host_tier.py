"""Issue 47 items 1, 3, 4 and 6 (sealing at rest) on the driver's side of the Ray launcher's
host tier: a RemoteInstance over fakes of its actor and of the node stores
(tests/helpers/fake_ray_store.py: a store call runs when sent, a step's reloads read the store
when the step is collected, through the real InstanceActor._reload). No Ray cluster; the Ray
runs are test_ray_host_tier_hardening.py.

The pool: 16 pages of 4 tokens. `_filled`: the node's tier (8 pages) holds X's 4 pages and
Y's 4, written and landed; Z's 5 pages are idle on the device."""

import pickle
import types

import numpy as np
import pytest

import pdjax.distributed.actor as actor_mod
import pdjax.distributed.remote as remote_mod
from helpers.fake_ray_store import FakeRay, FakeStore, Wedged, page_bytes, remote_instance
from pdjax.kv.host_tier import HostTier
from pdjax.kv.prefix_cache import flush_tenant, page_hashes
from pdjax.kv.remote_store import CrossNodeLink, RemoteReload
from pdjax.kv.seal import SealedPage, new_run_key
from pdjax.errors import HostTierLost, ReloadFailed, RemoteStoreLost

SALT = "tenant:a"
X = list(range(100, 116))
Y = list(range(200, 216))
Z = list(range(300, 321))


@pytest.fixture
def fake_ray(monkeypatch):
  fake = FakeRay()
  monkeypatch.setattr(remote_mod, "ray", fake)
  return fake


def _cache(tables, seq, tokens, now):
  tables.allocate_prefix(seq, tokens, len(tokens), SALT, now)
  tables.cache_computed(seq, len(tokens), now)
  tables.free(seq, now)


def _node(tier_pages=8, seal_key=None, node=0):
  tier, stores = HostTier(tier_pages, node=node), {node: FakeStore()}
  return (remote_instance(tier, stores, node=node, seal_key=seal_key), tier, stores[node])


def _filled(seal_key=None, node=0):
  inst, tier, store = _node(seal_key=seal_key, node=node)
  _cache(inst.tables, "x", X + [1], 0.0)
  _cache(inst.tables, "y", Y + [1], 1.0)
  inst.tables.allocate("fill", 16 * 4)   # X's and Y's pages evicted: offered, in flight
  inst.flush_offloads()                  # written to the store: landed
  inst.tables.free("fill", 2.0)
  _cache(inst.tables, "z", Z, 3.0)
  assert (len(tier), len(store.pages), inst.tables.num_cached_idle_pages) == (8, 8, 5)
  return inst, tier, store


def test_a_reload_keeps_its_pages_until_its_step_has_read_them(fake_ray):
  """Item 1: r4's step, dispatched, reads X's pages when the actor runs it; meanwhile r5's
  plan offers Z's 5 pages to the full tier. They evict Y's 4 (the fifth is refused: X's
  are held, Z's still being written), and the step reads every byte of X's."""
  inst, tier, store = _filled()
  x_names = list(store.pages)[:4]
  assert inst.tables.allocate_prefix("r4", X + [7], 17, SALT, now=6.0) == 16
  pending = inst.step("prefill", [], None)
  assert inst.tables.allocate("r5", 44) == [0, 1, 2, 3, 4, 10, 11, 12, 13, 14, 15]
  inst.flush_offloads()
  assert pending.result() == []
  (pages, arrays), = inst.actor.scatters
  assert pages == [5, 6, 7, 8]
  assert all(np.array_equal(a, page_bytes(n)) for a, n in zip(arrays, x_names))
  assert (tier.stats["evictions"], tier.stats["refused"], tier.pinned()) == (4, 1, 0)
  assert sorted(store.pages) == sorted(tier._pages) and len(store.pages) == 8


def test_a_killed_instance_lets_its_reads_go(fake_ray):
  inst, tier, _ = _filled()
  inst.tables.allocate_prefix("r4", X + [7], 17, SALT, now=6.0)
  inst.step("prefill", [], None)         # never collected: the instance dies
  assert tier.pinned() == 4
  inst.kill()
  assert tier.pinned() == 0


def test_a_flush_while_pages_are_in_flight_leaves_none_in_the_store(fake_ray):
  """Item 4: X's pages evicted (offered, not yet written), then tenant a flushed: the store's
  drop comes first, so the write that follows must not happen."""
  inst, tier, store = _node()
  _cache(inst.tables, "x", X + [1], 0.0)
  inst.tables.allocate("fill", 16 * 4)
  assert (len(tier), store.pages) == (4, {})
  assert flush_tenant([inst.tables], "a") == 4 and tier.stats["flushed"] == 4
  inst.flush_offloads()
  assert (store.pages, len(tier), inst.host_stats["offload_pages"]) == ({}, 0, 0)


def test_a_store_that_does_not_answer_loses_the_tier_instead_of_hanging(fake_ray):
  """Item 3: flush_offloads waits for the store at most store_timeout_s; then the tier is
  lost, as for a dead store."""
  inst, tier, store = _node()
  _cache(inst.tables, "x", X + [1], 0.0)
  inst.tables.allocate("fill", 16 * 4)
  store.wedged = True
  inst.flush_offloads()
  assert fake_ray.timeouts == [inst.store_timeout_s] == [remote_mod.STORE_TIMEOUT_S]
  assert tier.lost and inst._offloads == [] and inst.host_stats["offload_pages"] == 0


def test_a_reload_from_a_store_that_does_not_answer_fails_its_step(fake_ray, monkeypatch):
  """The actor waits for the store's pages at most STORE_TIMEOUT_S: the step fails with
  HostTierLost (its prompts start over), the tier is lost, and its pins go."""
  monkeypatch.setattr(actor_mod, "STORE_TIMEOUT_S", 0.05)
  inst, tier, store = _filled()
  inst.tables.allocate_prefix("r4", X + [7], 17, SALT, now=6.0)
  store.get = types.SimpleNamespace(remote=lambda names: Wedged())
  with pytest.raises(HostTierLost, match=r"^the node KV store is gone: TimeoutError$"):
    inst.step("prefill", [], None).result()
  assert (tier.lost, tier.pinned(), store.pages) == (True, 0, {})


def _two_nodes(tampered: int):
  """Node 0's tier and store hold X's 4 pages, sealed by its instance; an instance on node 1
  (its own tier empty) plans r's reload of them from node 0's store; that store flips a byte
  of the first piece of its next `tampered` reads."""
  key = new_run_key()
  tiers, stores = [HostTier(8, node=0), HostTier(8, node=1)], {0: FakeStore(), 1: FakeStore()}
  writer = remote_instance(tiers[0], stores, node=0, name="colocated-0", seal_key=key)
  inst = remote_instance(tiers[1], stores, node=1, name="colocated-1", seal_key=key)
  inst.tables.remote = RemoteReload([tiers[0]], page_bytes=1, page_size=4,
                                    recompute_s=lambda chunks: sum(q for q, _ in chunks),
                                    link=CrossNodeLink(1e9))
  names = page_hashes(SALT, X, 4, 4)
  for n in names:
    tiers[0].offer(n, SALT, SALT, n, writer="colocated-0", ready_s=0.0, now=0.0)
  stores[0].put.remote(writer.actor.actor.store_items(names, [page_bytes(n) for n in names],
                                                      key))
  stores[0].tamper_sealed_reads.remote(tampered)
  assert inst.tables.allocate_prefix("r", X + [7], 17, SALT, now=1.0) == 16
  return inst, tiers, stores, names


def test_a_sealed_page_that_did_not_open_once_is_read_again(fake_ray):
  inst, tiers, stores, names = _two_nodes(tampered=1)
  assert inst.step("prefill", [], None).result() == []
  (pages, arrays), = inst.actor.scatters
  assert pages == [0, 1, 2, 3]
  assert all(np.array_equal(a, page_bytes(n)) for a, n in zip(arrays, names))
  assert (tiers[0].lost, len(tiers[0]), tiers[0].pinned(), stores[0].store._tampered_reads) == (
      False, 4, 0, 0)


def test_a_sealed_page_that_did_not_open_twice_fails_that_reload_not_the_tier(fake_ray):
  """Item 3: the step fails (ReloadFailed: the driver recomputes its prompts), node 0's tier
  forgets only the page that did not open (its store drops it) and stays; the prompt,
  planned again, finds nothing after that page and computes it."""
  inst, tiers, stores, names = _two_nodes(tampered=2)
  with pytest.raises(ReloadFailed) as e:
    inst.step("prefill", [], None).result()
  assert not isinstance(e.value, RemoteStoreLost)
  assert str(e.value) == (f"node 0's KV store served pages that did not open, twice: "
                          f"sealed KV page {names[0].hex()[:12]} did not open (tampered, "
                          f"truncated, or not this page's)")
  assert (e.value.node, e.value.names) == (0, [names[0]])
  assert inst.actor.scatters == []
  assert (tiers[0].lost, tiers[0].stats["discarded"], tiers[0].pinned()) == (False, 1, 0)
  assert [n in tiers[0] for n in names] == [False, True, True, True]
  assert sorted(stores[0].pages) == sorted(names[1:])
  inst.tables.free("r", 2.0)             # (the driver's _recompute_prefills)
  assert inst.tables.allocate_prefix("r", X + [7], 17, SALT, now=3.0) == 0


def test_without_a_seal_key_the_store_holds_the_pages_themselves(fake_ray):
  _, _, store = _filled()
  assert all(np.array_equal(v, page_bytes(n)) for n, v in store.pages.items())


def test_with_a_seal_key_the_store_holds_sealed_pages_only_and_a_reload_opens_them(fake_ray):
  """Item 6: the instance seals what it offloads (the store never sees the key or a
  plaintext page: nor would a spill file of its objects) and opens what it reloads."""
  inst, tier, store = _filled(new_run_key())
  sealer = inst.actor.actor._sealer
  assert all(isinstance(v, SealedPage) for v in store.pages.values())
  assert not any(page_bytes(n).tobytes() in pickle.dumps(v) for n, v in store.pages.items())
  assert {v.key_id for v in store.pages.values()} == {(sealer.sealer_id, 0)}
  assert sealer.seals == 8
  x_names = list(store.pages)[:4]
  assert inst.tables.allocate_prefix("r4", X + [7], 17, SALT, now=6.0) == 16
  assert inst.step("prefill", [], None).result() == []
  (pages, arrays), = inst.actor.scatters
  assert pages == [5, 6, 7, 8]
  assert all(np.array_equal(a, page_bytes(n)) for a, n in zip(arrays, x_names))


def _sealed_on_node_1(tampered: int):
  """_filled's node as node 1 of two, sealed; node 0's tier (a peer) holds X's names too;
  node 1's store flips a byte of the first piece of its next `tampered` reads; r4 plans
  X's reload from its own node's tier."""
  inst, tier, store = _filled(new_run_key(), node=1)
  peer = HostTier(8, node=0)
  inst.tables.remote = RemoteReload([peer], page_bytes=1, page_size=4,
                                    recompute_s=lambda chunks: sum(q for q, _ in chunks),
                                    link=CrossNodeLink(1e9))
  x_names = list(store.pages)[:4]
  for n in x_names:
    peer.offer(n, SALT, SALT, n, writer="colocated-0", ready_s=0.0, now=0.0)
  store.tamper_sealed_reads.remote(tampered)
  assert inst.tables.allocate_prefix("r4", X + [7], 17, SALT, now=6.0) == 16
  return inst, tier, peer, store, x_names


def test_a_local_sealed_page_that_did_not_open_once_is_read_again(fake_ray):
  inst, tier, peer, store, x_names = _sealed_on_node_1(tampered=1)
  assert inst.step("prefill", [], None).result() == []
  (pages, arrays), = inst.actor.scatters
  assert all(np.array_equal(a, page_bytes(n)) for a, n in zip(arrays, x_names))
  assert (tier.stats["discarded"], tier.pinned(), store.store._tampered_reads) == (0, 0, 0)


def test_a_local_sealed_page_that_did_not_open_twice_is_forgotten_by_its_own_tier(fake_ray):
  """The step fails as a remote one does (RemotePagesUnread, naming this node): this node's
  tier forgets that page (its store drops it); the other node's tier is not touched."""
  inst, tier, peer, store, x_names = _sealed_on_node_1(tampered=2)
  with pytest.raises(ReloadFailed) as e:
    inst.step("prefill", [], None).result()
  assert str(e.value) == (f"node 1's KV store served pages that did not open, twice: "
                          f"sealed KV page {x_names[0].hex()[:12]} did not open (tampered, "
                          f"truncated, or not this page's)")
  assert (e.value.node, e.value.names) == (1, [x_names[0]])
  assert inst.actor.scatters == []
  assert (tier.lost, tier.stats["discarded"], tier.pinned()) == (False, 1, 0)
  assert [n in tier for n in x_names] == [False, True, True, True]
  assert x_names[0] not in store.pages and len(store.pages) == 7
  assert (peer.stats["discarded"], [n in peer for n in x_names]) == (0, [True] * 4)


def test_a_store_that_does_not_answer_the_clear_between_runs_is_replaced(monkeypatch):
  """RayCluster.clear_store waited on each store with no timeout: a wedged store hung the
  next run's start. It waits STORE_TIMEOUT_S, then kills that store (the next use starts a
  new one) and keeps the others."""
  import types

  import ray as real_ray
  from pdjax.distributed import launcher as launcher_lib
  from pdjax.distributed.node_store import STORE_TIMEOUT_S
  calls, killed = [], []

  def get(ref, timeout=None):
    calls.append((ref, timeout))
    if ref == "wedged":
      raise real_ray.exceptions.GetTimeoutError("Get timed out")
    return 0

  monkeypatch.setattr(launcher_lib.ray, "get", get)
  monkeypatch.setattr(launcher_lib.ray, "kill", lambda a, no_restart=True: killed.append(a))
  stores = {n: types.SimpleNamespace(clear=types.SimpleNamespace(remote=lambda r=r: r))
            for n, r in ((0, "fine"), (1, "wedged"))}
  cluster = launcher_lib.RayCluster.__new__(launcher_lib.RayCluster)
  cluster._stores = dict(stores)
  cluster.clear_store()
  assert calls == [("fine", STORE_TIMEOUT_S), ("wedged", STORE_TIMEOUT_S)]
  assert killed == [stores[1]] and cluster._stores == {0: stores[0]}
