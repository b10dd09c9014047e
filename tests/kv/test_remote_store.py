"""Host tiers on several nodes (issue 32, cluster.nodes, kv.remote_store): where instances
sit, a prefix reloaded from another node's tier only when that beats recomputing it, its
bytes counted as cross-node, sealing priced on the link, and a tenant flush reaching every
node's tier. Simulated (the calibrated CPU cost: the roofline's tiny-model prefill is
weight-bound, so no reload ever beats it); the Ray launcher's are tests/distributed."""

import pytest

from helpers import sim_snapshots
from helpers.checked_run import checked_run
from helpers.host_tier_trace import write_trace
from helpers.remote_store_trace import remote_overrides, remote_rows
from pdjax import config as config_lib
from pdjax.kv.remote_store import CrossNodeLink, RemoteReload, nodes_of
from pdjax.runner.execute import execute


def test_instances_fill_the_nodes_in_even_blocks():
  assert nodes_of(4, 2) == [0, 0, 1, 1]
  assert nodes_of(2, 2) == [0, 1]
  assert nodes_of(3, 2) == [0, 0, 1]
  assert nodes_of(5, 1) == [0] * 5
  assert nodes_of(2, 4) == [0, 2]
  with pytest.raises(ValueError, match=r"^nodes must be >= 1, got 0$"):
    nodes_of(2, 0)


def test_a_remote_reload_is_taken_when_the_link_beats_the_prefill_it_saves():
  link = CrossNodeLink(bytes_per_s=1000.0, seal_bytes_per_s=500.0, host_bytes_per_s=2000.0)
  assert link.seconds(100) == 0.1 + 0.4 + 0.1     # the link; sealed once, opened once; copied
  assert CrossNodeLink(1000.0).seconds(100) == 0.1   # device -> host, host -> device
  saved = []

  def recompute_s(chunks):   # 1 ms per new token
    saved.append(chunks)
    return sum(q for q, _ in chunks) * 1e-3
  r = RemoteReload([], recompute_s=recompute_s, page_bytes=10, page_size=16,
                   link=CrossNodeLink(1000.0))
  assert r.saved_s(2, 16, 80) == pytest.approx(0.032)    # 64 tokens after 16, less 32 after 48
  assert saved == [[(64, 16)], [(32, 48)]]
  assert r.reload_s(2) == 0.02 and r.worth(2, 16, 80)
  slow = RemoteReload([], recompute_s=recompute_s, page_bytes=10, page_size=16,
                      link=CrossNodeLink(500.0))
  assert slow.reload_s(2) == 0.04 and not slow.worth(2, 16, 80)
  far = RemoteReload([], recompute_s=recompute_s, page_bytes=10, page_size=16,
                     link=CrossNodeLink(1000.0, latency_s=0.02))
  assert far.reload_s(2) == 0.04 and not far.worth(2, 16, 80)   # (its round trip first)


def _run(tmp_path, last_tenant="a", **more):
  path = tmp_path / f"remote_{last_tenant}.jsonl"
  write_trace(path, remote_rows(last_tenant))
  cfg = sim_snapshots._config(remote_overrides(path, **{"sim.cost_model": "calibrated",
                                                        **more}))
  return checked_run(cfg)


def test_the_other_nodes_store_serves_a_prefix_when_predicted_faster(tmp_path):
  on, r_on, insts = _run(tmp_path)
  off, r_off, _ = _run(tmp_path, **{"kv.remote_store": False})
  assert [i.node for i in insts] == [0, 1]
  assert [r.prefill_instance for r in r_on.requests] == [
      "colocated-0", "colocated-1", "colocated-0", "colocated-1"]
  assert [r.cached_tokens for r in r_on.requests] == [0, 0, 0, 48]
  assert [r.cached_tokens for r in r_off.requests] == [0, 0, 0, 0]
  assert [r.output_ids for r in r_on.requests] == [r.output_ids for r in r_off.requests]
  host, page = on["kv_cache"]["host_tier"], insts[0].kv_bytes(1)
  assert (host["nodes"], host["hit_pages"], host["remote_hit_pages"]) == (2, 3, 3)
  assert (host["remote_loaded_bytes"], host["loaded_bytes"]) == (3 * page, 3 * page)
  layer = on["kv_layer"]
  assert (layer["cross_node_bytes"], layer["cross_node_reload_bytes"],
          layer["cross_node_transfer_bytes"]) == (3 * page, 3 * page, 0)
  assert r_on.requests[3].ttft_s < r_off.requests[3].ttft_s
  assert off["kv_cache"]["host_tier"]["remote_hit_pages"] == 0


def test_a_slow_link_recomputes_and_counts_the_pages_it_declined(tmp_path):
  on, r_on, _ = _run(tmp_path, **{"kv.cross_node_gbps": 1e-4})
  assert [r.cached_tokens for r in r_on.requests] == [0, 0, 0, 0]
  host = on["kv_cache"]["host_tier"]
  assert (host["remote_hit_pages"], host["remote_declined_pages"]) == (0, 3)
  assert on["kv_layer"]["cross_node_bytes"] == 0


def test_another_tenant_never_loads_them_from_any_node(tmp_path):
  on, r_on, _ = _run(tmp_path, last_tenant="b")
  assert r_on.requests[3].cached_tokens == 0
  assert on["kv_cache"]["host_tier"]["remote_declined_pages"] == 0


def test_a_tenant_flush_reaches_every_nodes_tier(tmp_path):
  """Flushed at 3.5 s, when node 0's tier holds X's pages and node 1's r1's (evicted by r3):
  both tiers forget them, and nothing of the tenant is left to reload from either node."""
  on, r_on, insts = _run(tmp_path, **{"kv.flush_tenants": "a@3.5"})
  tiers = [i.tables.host for i in insts]
  assert tiers[0] is not tiers[1]
  assert [t.stats["flushed"] for t in tiers] == [t.stats["offloaded"] for t in tiers]
  assert all(t.stats["flushed"] > 0 for t in tiers) and [len(t) for t in tiers] == [0, 0]
  assert on["kv_cache"]["host_tier"]["pages_at_end"] == 0
  from pdjax.kv.prefix_cache import prefix_names
  from helpers.host_tier_trace import X
  names = prefix_names("tenant:a", X, 16)[:3]
  assert [t.ready_prefix(names, "tenant:a", 1e9) for t in tiers] == [0, 0]


def _disaggregated(sealed: bool):
  cfg = sim_snapshots._config({"mode": "disaggregated", "cluster.nodes": 2,
                               "kv.prefix_cache": True,
                               "cluster.prefill.instances": 1, "cluster.decode.instances": 1,
                               "kv.seal_cross_node": sealed, "kv.cross_node_gbps": 8.0,
                               "kv.seal_gbps": 16.0, "sim.host_link_gbps": 32.0,
                               "workload.num_requests": 6})
  summary, result, instances = execute(cfg, config_lib.validate(cfg), "disaggregated", None,
                                       quiet=True)
  assert summary["kv_pages_leaked"] == 0
  return summary, result, instances


def test_prefill_and_decode_on_two_nodes_move_kv_over_their_link_sealed_or_not():
  plain, r_plain, insts = _disaggregated(False)
  sealed, r_sealed, _ = _disaggregated(True)
  assert [i.node for i in insts] == [0, 1]
  moved = [r.transfer_bytes for r in r_plain.requests]
  assert [r.transfer_s for r in r_plain.requests] == [b / 1e9 for b in moved]       # 8 Gbit/s
  assert [r.transfer_s for r in r_sealed.requests] == pytest.approx(
      [b / 1e9 + 2 * b / 2e9 + 2 * b / 4e9 for b in moved], rel=1e-12)   # + sealing, host copies
  assert [r.output_ids for r in r_sealed.requests] == [r.output_ids for r in r_plain.requests]
  assert plain["kv_layer"]["cross_node_transfer_bytes"] == sum(moved) > 0


@pytest.mark.parametrize("overrides, message", [
    ({"cluster.nodes": 0}, "cluster.nodes=0 must be an integer >= 1"),
    ({"backend": "jax", "cluster.nodes": 2},
     "cluster.nodes=2 needs cluster.launcher=ray or backend='sim' (one process is one node)"),
    ({"cluster.nodes": 2, "kv.seal_gbps": 0.0}, "kv.seal_gbps=0.0 must be a finite number > 0"),
    ({"kv.remote_store": True},
     "kv.remote_store=True needs a host tier on every node (kv.host_tier_pages > 0)"),
    ({"kv.remote_store": True, "kv.prefix_cache": True, "kv.host_tier_pages": 8},
     "kv.remote_store=True needs cluster.nodes > 1 (with one node every store is local)"),
    ({"kv.seal_cross_node": True},
     "kv.seal_cross_node=True needs cluster.nodes > 1 (nothing leaves a node)"),
    ({"cluster.nodes": 2, "kv.stream_layers": 2}, "kv.stream_layers=2 needs cluster.nodes=1 "
     "(layer-group streams are not sealed or timed across nodes)"),
])
def test_bad_node_settings_are_one_line_errors(overrides, message):
  cfg = sim_snapshots._config(overrides)
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg)
  assert str(e.value) == message


def test_the_engine_needs_a_latency_profile_to_predict_the_recompute():
  cfg = sim_snapshots._config({"backend": "jax", "cluster.launcher": "ray", "cluster.nodes": 2,
                               "kv.prefix_cache": True, "kv.host_tier_pages": 8,
                               "kv.remote_store": True})
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg)
  assert str(e.value) == ("kv.remote_store=True needs scheduler.latency_profile on the jax "
                          "backend (the recompute a remote reload must beat is predicted from it)")


def test_what_ran_names_the_nodes_and_the_sealing():
  from pdjax.runner.execute import run_info_of
  cfg = sim_snapshots._config({"mode": "disaggregated", "cluster.nodes": 2,
                               "cluster.prefill.instances": 1, "cluster.decode.instances": 1,
                               "kv.seal_cross_node": True})
  placement = run_info_of(cfg, config_lib.validate(cfg), "disaggregated")["placement"]
  assert placement["describe"] == "1xP(tp2) + 1xD(tp2), on 2 nodes (KV leaving a node sealed)"
  assert (placement["nodes"], placement["sealed"]) == (2, True)
  one = sim_snapshots._config({"mode": "disaggregated"})
  assert "nodes" not in run_info_of(one, config_lib.validate(one), "disaggregated")["placement"]


def test_each_nodes_store_has_its_own_occupancy_track(tmp_path):
  """Samples carry their own node's tier size: with node_of the plot and the trace draw one
  track per node (ending at that tier's size) instead of one track alternating between
  them."""
  from pdjax.metrics.kv_layer import host_tier_pages
  from pdjax.metrics.trace import host_tier_counter
  from pdjax.runner.outputs import node_of_instances
  on, r_on, insts = _run(tmp_path)
  cfg = sim_snapshots._config(remote_overrides(tmp_path / "remote_a.jsonl"))
  node_of = node_of_instances(cfg, "colocated")
  assert node_of == {"colocated-0": 0, "colocated-1": 1}
  tracks = host_tier_pages(r_on.samples, node_of)
  assert [(k, p.tolist()) for k, (_, p) in tracks.items()] == [
      (0, [0.0, 0.0, 3.0, 3.0]), (1, [0.0, 0.0, 0.0, 4.0, 5.0, 5.0, 5.0, 5.0])]
  assert [len(i.tables.host) for i in insts] == [3, 5]
  events = host_tier_counter(r_on.samples, None, node_of)
  assert [(e["name"], e["args"]["pages"]) for e in events][3:5] == [
      ("host tier pages (node 0)", 3), ("host tier pages (node 1)", 0)]
  assert {e["name"] for e in host_tier_counter(r_on.samples, None)} == {"host tier pages"}
  assert node_of_instances(sim_snapshots._config({}), "colocated") is None
