"""Issue 47 item 3 on two Ray nodes (test_ray_nodes.py's cluster and trace): r3, on node 1,
reloads X's 3 pages from node 0's store, which holds them sealed by node 0's instance
(kv.seal_cross_node); that store hands out a corrupt piece (NodeStore.tamper_sealed_reads). Once: the read is retried and served. Twice:
that reload fails, r3 recomputes X, and node 0's tier forgets the page that did not open and
nothing else (before: the whole tier of node 0 was lost for the rest of the run)."""

import pytest

from helpers import sim_snapshots
from helpers.checked_run import checked_run
from helpers.host_tier_trace import write_trace
from helpers.remote_store_trace import remote_overrides, remote_rows
from pdjax import config as config_lib
from test_ray_nodes import two_nodes  # noqa: F401  (its module's two-node fixture)


def _remote(tmp_path, two_nodes, **more):
  path = tmp_path / "remote.jsonl"
  write_trace(path, remote_rows())
  cfg = sim_snapshots._config(remote_overrides(path, **{
      "backend": "jax", "cluster.launcher": "ray", "cluster.transfer_host": "node",
      "scheduler.latency_profile": config_lib.DEFAULT_PROFILE, **more}))
  return checked_run(cfg, "colocated", two_nodes)


@pytest.mark.slow
def test_a_sealed_page_that_does_not_open_fails_that_reload_not_the_tier(tmp_path, two_nodes,
                                                                        monkeypatch):
  import ray

  from pdjax.distributed.launcher import RayCluster
  held, clear = [], RayCluster.clear_store   # (each store's pages right after a run)
  monkeypatch.setattr(RayCluster, "clear_store", lambda self: (held.extend(
      ray.get([self._stores[n].held.remote() for n in sorted(self._stores)])), clear(self)))
  off, r_off, _ = _remote(tmp_path, two_nodes, **{"kv.remote_store": False})
  for tampered, cached, failed, discarded in ((1, 48, 0, 0), (2, 0, 1, 1)):
    ray.get(two_nodes.node_store(0).tamper_sealed_reads.remote(tampered))
    on, r_on, insts = _remote(tmp_path, two_nodes, **{"kv.seal_cross_node": True})
    assert [r.output_ids for r in r_on.requests] == [r.output_ids for r in r_off.requests]
    assert [r.cached_tokens for r in r_on.requests] == [0, 0, 0, cached], tampered
    assert on["faults"].get("reload_failed_steps", 0) == failed
    assert on["faults"].get("host_tier_lost_steps", 0) == 0
    tier = insts[0].tables.host
    assert (tier.lost, tier.stats["discarded"], tier.stats["offloaded"], len(tier),
            tier.pinned()) == (False, discarded, 3, 3 - discarded, 0), tampered
    assert held[-2] == 3 - discarded          # (node 0's store dropped that page too)
