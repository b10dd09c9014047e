"""The host KV tier under the Ray launcher (issue 32): its pages' bytes in the node's store
actor (distributed/node_store.py), written and read by the instance processes, its bookkeeping
in the driver. test_host_tier_serving's hand-built trace: r0 (tenant a) caches X, 4 full
pages; three fillers evict them; r4 asks for X + 16 tokens at 4 s."""

import pytest

from helpers import sim_snapshots
from helpers.checked_run import checked_run
from helpers.host_tier_trace import trace_rows, write_trace
from helpers.ray_fixtures import ray_cluster  # noqa: F401  (fixture)


def _config(tmp_path, host_pages, last_tenant="a", launcher="ray"):
  path = tmp_path / f"trace_{last_tenant}.jsonl"
  write_trace(path, trace_rows(last_tenant))
  return sim_snapshots._config({
      "backend": "jax", "mode": "colocated", "workload.kind": "jsonl",
      "workload.path": str(path), "workload.num_requests": 5,
      "cluster.colocated.instances": 1, "cluster.launcher": launcher, "kv.page_size": 16,
      "kv.max_model_len": 128, "kv.pages_per_instance": 16, "kv.prefix_cache": True,
      "kv.host_tier_pages": host_pages})


def _serve(cfg, ray_cluster=None):
  return checked_run(cfg, ray_cluster=ray_cluster)


@pytest.mark.slow
def test_actors_reload_through_the_node_store_as_one_process_does(tmp_path, ray_cluster):
  """Same reloads (X's 4 pages, 64 tokens) and the same greedy tokens as the in-process tier
  and as no tier at all; the store holds the tier's pages, then is emptied for the next run."""
  local, r_local, _ = _serve(_config(tmp_path, 64, launcher="local"))
  off, r_off, _ = _serve(_config(tmp_path, 0), ray_cluster)
  on, r_on, insts = _serve(_config(tmp_path, 64), ray_cluster)
  assert [r.output_ids for r in r_on.requests] == [r.output_ids for r in r_local.requests] == [
      r.output_ids for r in r_off.requests]
  assert [r.cached_tokens for r in r_on.requests] == [0, 0, 0, 0, 64] == [
      r.cached_tokens for r in r_local.requests]
  host, host_local = on["kv_cache"]["host_tier"], local["kv_cache"]["host_tier"]
  assert (host["hit_pages"], host["hit_lookups"]) == (4, 1) == (
      host_local["hit_pages"], host_local["hit_lookups"])
  assert host["offloaded_pages"] == host_local["offloaded_pages"]
  assert host["loaded_bytes"] == 4 * insts[0].page_bytes
  assert 0 < host["load_s_total"] < 5.0              # (the actor's fetch and scatter, timed)
  import ray
  assert ray.get(ray_cluster.node_store().held.remote()) == 0      # (cleared after the run)


@pytest.mark.slow
def test_another_tenant_never_loads_the_pages(tmp_path, ray_cluster):
  on, r_on, _ = _serve(_config(tmp_path, 64, last_tenant="b"), ray_cluster)
  assert r_on.requests[-1].cached_tokens == 0
  assert on["kv_cache"]["host_tier"]["hit_pages"] == 0


@pytest.mark.slow
def test_a_store_killed_mid_run_loses_the_tier_and_nothing_else(tmp_path, ray_cluster,
                                                                monkeypatch):
  """The store dies just as r4's reload is planned (after X's pages landed in it): r4's step
  does not run (HostTierLost), the tier is lost, r4 starts over and recomputes X; every
  request finishes with the tokens of a run without the tier."""
  import ray

  from pdjax.kv.host_tier import HostTier
  off, r_off, _ = _serve(_config(tmp_path, 0), ray_cluster)
  take = HostTier.take

  def take_then_kill_the_store(self, names, salt, now):
    out = take(self, names, salt, now)
    if out:                          # (a lookup that found nothing takes nothing)
      ray.kill(ray_cluster._stores[0], no_restart=True)
    return out

  monkeypatch.setattr(HostTier, "take", take_then_kill_the_store)
  on, r_on, _ = _serve(_config(tmp_path, 64), ray_cluster)
  assert 0 not in ray_cluster._stores               # (the next run starts a new store)
  assert [r.output_ids for r in r_on.requests] == [r.output_ids for r in r_off.requests]
  assert r_on.requests[-1].cached_tokens == 0            # recomputed after the lost reload
  assert on["faults"]["host_tier_lost_steps"] == 1
  assert on["kv_cache"]["host_tier"]["pages_at_end"] == 0
  assert on["kv_cache"]["host_tier"]["hit_pages"] == 4        # (the reload was planned)


@pytest.mark.slow
def test_a_flush_reaches_the_pool_and_the_store(tmp_path, ray_cluster, monkeypatch):
  """Tenant a flushed at 3.5 s (after X's pages landed in the store, before r4): every page the
  tier forgets (flushed or evicted) is dropped from the store too, r4 recomputes X, and the
  audit has the flush's line for the actor's pool and for the host tier."""
  from pdjax.kv.host_tier import HostTier
  forgotten = []
  forget = HostTier._forget
  monkeypatch.setattr(HostTier, "_forget",
                      lambda self, names: (forgotten.extend(names), forget(self, names)))
  cfg = _config(tmp_path, 64)
  cfg.kv.flush_tenants = "a@3.5"
  on, r_on, _ = _serve(cfg, ray_cluster)
  assert r_on.requests[-1].cached_tokens == 0
  flushes = [(line["tier"], line["instance"], line["tenant"]) for line in r_on.kv_audit
             if line["event"] == "flush"]
  assert flushes == [("device", "colocated-0", "tenant:a"), ("host", "", "tenant:a")]
  host = on["kv_cache"]["host_tier"]
  assert host["flushed_pages"] > 0 and host["hit_pages"] == 0
  assert len(forgotten) == host["flushed_pages"] + host["evicted_pages"]


@pytest.mark.slow
def test_the_store_keeps_large_pages_as_its_own_objects(ray_cluster):
  """Pages of at least large_page_bytes are put into Ray's object store by the store (refs
  handed out, fetched by the reader: fetch_pages); smaller ones stay in the actor; both come
  back equal, sealed (by the writer: the store holds SealedPages, a large one's object too)
  or not, and a dropped page's object is let go."""
  import asyncio

  import numpy as np
  import ray

  from pdjax.distributed.node_store import NodeStore, fetch_pages
  from pdjax.distributed.sealed_kv import open_pages, seal_pages
  from pdjax.kv.seal import PageSealer, SealedPage, SealError, new_run_key
  store = ray.remote(NodeStore).remote(large_page_bytes=1024)
  big, small = np.arange(512, dtype=np.float32), np.arange(16, dtype=np.float32)
  assert ray.get(store.put.remote({b"big": big, b"small": small})) == 2048 + 64
  got = ray.get(store.get.remote([b"big", b"small"]))
  assert [type(g).__name__ for g in got] == ["ObjectRef", "ndarray"]
  arrays = asyncio.run(fetch_pages(got))
  assert np.array_equal(arrays[0], big) and np.array_equal(arrays[1], small)
  sealer = PageSealer(new_run_key())
  names = [b"sealed-big", b"sealed-small"]
  assert ray.get(store.put.remote(dict(zip(names, seal_pages(sealer, names, [big, small]))))
                 ) == 2048 + 16 + 64 + 16
  got = ray.get(store.get.remote(names))
  assert [type(g).__name__ for g in got] == ["ObjectRef", "SealedPage"]
  pieces = asyncio.run(fetch_pages(got))
  assert all(isinstance(p, SealedPage) for p in pieces)
  opened = open_pages(sealer, names, pieces)
  assert np.array_equal(opened[0], big) and np.array_equal(opened[1], small)
  ray.get(store.tamper_sealed_reads.remote(1))   # (the next read's first piece: inline)
  got = ray.get(store.get.remote(names))
  assert [type(g).__name__ for g in got] == ["SealedPage", "SealedPage"]
  with pytest.raises(SealError, match=r"^sealed KV page 7365616c6564 did not open"):
    open_pages(sealer, names, got)
  assert len(open_pages(sealer, names, asyncio.run(fetch_pages(
      ray.get(store.get.remote(names)))))) == 2
  assert ray.get(store.drop.remote([b"big"])) == 1 and ray.get(store.held.remote()) == 3
  ray.kill(store)
