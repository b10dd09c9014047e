"""Two Ray nodes on one machine (issue 32: `ray.cluster_utils.Cluster`, cluster.nodes=2,
transfer servers on each actor's node address): prefill on one node and decode on the other,
KV between them sealed or not (kv.seal_cross_node) with the same greedy tokens as one process,
a tampered piece refused and recovered; and a prefix reloaded from the other node's store
(kv.remote_store) only when predicted faster, its bytes counted as cross-node."""

import warnings

import pytest

from helpers import sim_snapshots
from helpers.checked_run import checked_run
from helpers.host_tier_trace import write_trace
from helpers.remote_store_trace import remote_overrides, remote_rows
from pdjax import config as config_lib

PULL_TIMEOUT_S = 10.0


@pytest.fixture(scope="module")
def two_nodes(compile_cache):
  import ray
  from ray.cluster_utils import Cluster

  from pdjax.distributed.launcher import RayCluster
  if ray.is_initialized():
    ray.shutdown()
  with warnings.catch_warnings():   # (Ray's daemons: fork + exec, as in RayCluster.start)
    warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called",
                            category=RuntimeWarning)
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    nodes.add_node(num_cpus=1)
  nodes.wait_for_nodes()
  try:
    with RayCluster(address=nodes.address, accelerator="cpu", transfer_host="node",
                    pull_timeout_s=PULL_TIMEOUT_S, compile_cache_dir=compile_cache) as c:
      yield c
  finally:
    nodes.shutdown()


def _serve(cfg, run, cluster=None):
  return checked_run(cfg, run, cluster)


def _pd(**more):
  base = {"backend": "jax", "mode": "disaggregated", "cluster.prefill.instances": 1,
          "cluster.decode.instances": 1, "workload.num_requests": 4, "kv.prefix_cache": True}
  if more.pop("ray", True):
    base.update({"cluster.launcher": "ray", "cluster.nodes": 2,
                 "cluster.transfer_host": "node"})
  return sim_snapshots._config({**base, **more})


@pytest.mark.slow
def test_prefill_and_decode_on_two_nodes_give_one_process_tokens_sealed_or_not(two_nodes):
  _, local, _ = _serve(_pd(ray=False), "disaggregated")
  plain, r_plain, insts = _serve(_pd(), "disaggregated", two_nodes)
  sealed, r_sealed, _ = _serve(_pd(**{"kv.seal_cross_node": True}), "disaggregated", two_nodes)
  assert [i.node for i in insts] == [0, 1]
  assert insts[0].ray_node_id != insts[1].ray_node_id        # (really two Ray nodes)
  want = [r.output_ids for r in local.requests]
  assert [r.output_ids for r in r_plain.requests] == want
  assert [r.output_ids for r in r_sealed.requests] == want
  moved = sum(r.transfer_bytes for r in r_sealed.requests)
  assert moved > 0 and sealed["kv_layer"]["cross_node_transfer_bytes"] == moved
  assert moved == sum(r.transfer_bytes for r in r_plain.requests)


@pytest.mark.slow
def test_a_tampered_piece_is_refused_then_the_transfer_retried(two_nodes):
  _, local, _ = _serve(_pd(ray=False, **{"workload.num_requests": 8}), "disaggregated")
  on, r_on, _ = _serve(_pd(**{"kv.seal_cross_node": True, "faults.tamper_prob": 0.5,
                              "workload.num_requests": 8}), "disaggregated", two_nodes)
  assert [r.output_ids for r in r_on.requests] == [r.output_ids for r in local.requests]
  faults = on["faults"]
  # the seeded draws (FaultInjector.tamper_attempt): req-00005's first three attempts and
  # req-00007's first are tampered; each is refused by the decode actor and retried
  assert faults["injected"]["tamper"] == 4
  assert (faults["transfer_retries"], faults["transfers_recovered"]) == (4, 2)
  (why, n), = faults["transfer_errors"].items()
  assert n == 4 and why == ("SealError: sealed KV page 6b762d747261 did not open (tampered, "
                            "truncated, or not this page's)")
  assert faults["fell_back_requests"] == 0


def _remote(tmp_path, two_nodes, **more):
  path = tmp_path / "remote.jsonl"
  write_trace(path, remote_rows())
  cfg = sim_snapshots._config(remote_overrides(path, **{
      "backend": "jax", "cluster.launcher": "ray", "cluster.transfer_host": "node",
      "scheduler.latency_profile": config_lib.DEFAULT_PROFILE, **more}))
  return _serve(cfg, "colocated", two_nodes)


@pytest.mark.slow
def test_a_prefix_comes_from_the_other_nodes_store_when_predicted_faster(tmp_path, two_nodes):
  off, r_off, _ = _remote(tmp_path, two_nodes, **{"kv.remote_store": False})
  on, r_on, insts = _remote(tmp_path, two_nodes)
  sealed, r_sealed, _ = _remote(tmp_path, two_nodes, **{"kv.seal_cross_node": True})
  assert [r.cached_tokens for r in r_off.requests] == [0, 0, 0, 0]
  for summary, result in ((on, r_on), (sealed, r_sealed)):
    assert [r.output_ids for r in result.requests] == [r.output_ids for r in r_off.requests]
    assert [r.cached_tokens for r in result.requests] == [0, 0, 0, 48]
    host, page = summary["kv_cache"]["host_tier"], insts[0].page_bytes
    assert (host["nodes"], host["remote_hit_pages"], host["remote_loaded_bytes"]) == (
        2, 3, 3 * page)
    assert summary["kv_layer"]["cross_node_reload_bytes"] == 3 * page


@pytest.mark.slow
def test_a_slow_link_recomputes_instead(tmp_path, two_nodes):
  on, r_on, _ = _remote(tmp_path, two_nodes, **{"kv.cross_node_gbps": 1e-4})
  assert [r.cached_tokens for r in r_on.requests] == [0, 0, 0, 0]
  host = on["kv_cache"]["host_tier"]
  assert (host["remote_hit_pages"], host["remote_declined_pages"]) == (0, 3)


@pytest.mark.slow
def test_the_other_nodes_store_killed_mid_reload_loses_that_tier_only(tmp_path, two_nodes,
                                                                     monkeypatch):
  """Node 0's store dies as r3 (on node 1) plans its reload from it: r3's step does not run
  (RemoteStoreLost), node 0's tier is lost, r3 recomputes X; node 1's tier stays."""
  import ray

  from pdjax.kv.host_tier import HostTier
  off, r_off, _ = _remote(tmp_path, two_nodes, **{"kv.remote_store": False})
  take = HostTier.take

  def take_then_kill_its_store(self, names, salt, now):
    out = take(self, names, salt, now)
    if out and self.node == 0:
      ray.kill(two_nodes._stores[0], no_restart=True)
    return out

  monkeypatch.setattr(HostTier, "take", take_then_kill_its_store)
  on, r_on, insts = _remote(tmp_path, two_nodes)
  assert [r.output_ids for r in r_on.requests] == [r.output_ids for r in r_off.requests]
  assert [r.cached_tokens for r in r_on.requests] == [0, 0, 0, 0]
  assert on["faults"]["host_tier_lost_steps"] == 1
  assert [i.tables.host.lost for i in insts] == [True, False]
  assert 0 not in two_nodes._stores and 1 in two_nodes._stores


@pytest.mark.slow
def test_a_tenant_flush_empties_both_nodes_stores(tmp_path, two_nodes, monkeypatch):
  """Tenant a flushed at 4.5 s, when node 0's store holds X's pages and node 1's r1's: both
  stores are empty right after the run (before they are cleared for the next), the audit has
  the flush's line for each pool and each node's tier, and r4 (X again, at 5 s, on node 0)
  finds X on neither node. (The flush comes 1.5 s after r3, which must find X before it: a
  driver held up by a loaded machine still meets them in that order.)"""
  import ray

  from pdjax.distributed.launcher import RayCluster
  held = []
  clear = RayCluster.clear_store
  monkeypatch.setattr(RayCluster, "clear_store", lambda self: (held.extend(
      ray.get([self._stores[n].held.remote() for n in sorted(self._stores)])), clear(self)))
  rows = remote_rows() + [dict(remote_rows()[3], arrival_s=5.0)]
  path = tmp_path / "flush.jsonl"
  write_trace(path, rows)
  cfg = sim_snapshots._config(remote_overrides(path, **{
      "backend": "jax", "cluster.launcher": "ray", "cluster.transfer_host": "node",
      "scheduler.latency_profile": config_lib.DEFAULT_PROFILE, "workload.num_requests": 5,
      "kv.flush_tenants": "a@4.5"}))
  on, r_on, insts = _serve(cfg, "colocated", two_nodes)
  assert [r.cached_tokens for r in r_on.requests] == [0, 0, 0, 48, 0]
  assert r_on.requests[4].prefill_instance == "colocated-0"
  assert held == [0, 0]
  flushes = [(line["tier"], line["instance"]) for line in r_on.kv_audit
             if line["event"] == "flush"]
  assert sorted(flushes) == [("device", "colocated-0"), ("device", "colocated-1"),
                             ("host", ""), ("host", "")]
  assert all(i.tables.host.stats["flushed"] > 0 for i in insts)
