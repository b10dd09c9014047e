"""The host KV tier in a simulated run (issue 18): evicted prefix pages are offloaded to it and
reloaded instead of recomputed — with the same tokens as without it — only under their
tenant's salt, forgotten by a tenant flush in both tiers, and lost (never served) when their
writer dies before the copy landed. Nothing leaks in either tier.

The workload is hand-built (jsonl with token ids) on one instance of 16 pages of 16 tokens:
r0 (tenant a) caches X, 64 tokens = 4 full pages; three fillers of 112 tokens each need 7
pages, so the second one evicts X's 4 pages (least recently used) to the host tier; r4, X plus
16 new tokens, then finds X's 4 pages in the host tier: 64 prompt tokens reloaded, not
recomputed."""

import pytest

from helpers import sim_snapshots
from helpers.checked_run import checked_run
from helpers.host_tier_trace import X, trace_rows, write_trace
from pdjax import config as config_lib
from pdjax.runner.execute import execute


def _trace(path, last_tenant="a"):
  write_trace(path, trace_rows(last_tenant))


def _run(tmp_path, host_pages, last_tenant="a", backend="sim", **more):
  path = tmp_path / f"trace_{last_tenant}.jsonl"
  _trace(path, last_tenant)
  cfg = sim_snapshots._config({"backend": backend,
      "mode": "colocated", "workload.kind": "jsonl", "workload.path": str(path),
      "workload.num_requests": 5, "cluster.colocated.instances": 1, "kv.page_size": 16,
      "kv.max_model_len": 128, "kv.pages_per_instance": 16, "kv.prefix_cache": True,
      "kv.host_tier_pages": host_pages, **more})
  return checked_run(cfg)


def test_a_prefix_evicted_to_the_host_is_reloaded_with_the_same_tokens(tmp_path):
  off, r_off, _ = _run(tmp_path, 0)
  on, r_on, insts = _run(tmp_path, 64)
  assert [r.output_ids for r in r_on.requests] == [r.output_ids for r in r_off.requests]
  assert [r.cached_tokens for r in r_off.requests] == [0, 0, 0, 0, 0]
  assert [r.cached_tokens for r in r_on.requests] == [0, 0, 0, 0, 64]
  host = on["kv_cache"]["host_tier"]
  assert (host["hit_pages"], host["hit_lookups"]) == (4, 1)
  assert host["loaded_bytes"] == 4 * insts[0].kv_bytes(1)
  assert host["offloaded_pages"] >= 4 and host["lost_in_flight_pages"] == 0
  assert "host_tier" not in off["kv_cache"]


def test_another_tenant_never_loads_the_pages(tmp_path):
  on, r_on, _ = _run(tmp_path, 64, last_tenant="b")
  assert r_on.requests[-1].cached_tokens == 0
  assert on["kv_cache"]["host_tier"]["hit_pages"] == 0
  assert on["kv_cache"]["host_tier"]["pages_per_tenant"] == {"tenant:a": on["kv_cache"][
      "host_tier"]["pages_at_end"]}


def test_a_flush_empties_both_tiers_for_the_tenant(tmp_path):
  on, r_on, _ = _run(tmp_path, 64, **{"kv.flush_tenants": "a@3.5"})
  host = on["kv_cache"]["host_tier"]
  assert r_on.requests[-1].cached_tokens == 0 and host["hit_pages"] == 0
  assert host["flushed_pages"] >= 4 and host["pages_at_end"] == 0
  assert host["flushed_pages"] == host["offloaded_pages"] - host["evicted_pages"]
  flushed = on["kv_cache"]["flushes"][0]   # both tiers: the device pool's pages as well
  assert flushed["tenant"] == "a" and flushed["pages"] > host["flushed_pages"]


def test_writes_in_flight_die_with_their_writer(tmp_path):
  """A host link so slow that no copy lands before the instance is killed (at 3.5 s, with a
  restart): its writes are dropped, none is ever read, r4 recomputes X, nothing leaks."""
  off, r_off, _ = _run(tmp_path, 0, **{"faults.kill_instance": "colocated-0@3.5",
                                       "faults.restart_s": 0.1})
  on, r_on, _ = _run(tmp_path, 64, **{"sim.host_link_gbps": 1e-6,
                                      "faults.kill_instance": "colocated-0@3.5",
                                      "faults.restart_s": 0.1})
  host = on["kv_cache"]["host_tier"]
  assert host["offloaded_pages"] >= 4
  assert host["lost_in_flight_pages"] == host["offloaded_pages"]
  assert host["hit_pages"] == 0 and host["pages_at_end"] == 0
  assert [r.output_ids for r in r_on.requests] == [r.output_ids for r in r_off.requests]


def test_routers_count_host_pages_after_the_device_prefix_at_their_weight():
  """A holds X's first 2 pages on its device, B none; the node's host tier holds all 4: A's
  credit is 2 + 2w, B's 4w (w = what a reload saves against a recompute)."""
  from types import SimpleNamespace

  from pdjax.kv.host_tier import HostTier
  from pdjax.kv.pages import BlockTables
  from pdjax.kv.prefix_cache import prefix_names
  from pdjax.scheduler.policies.kv_aware_prefix import KvAwarePrefix
  from pdjax.scheduler.instance_queue import InstanceQueue
  from pdjax.request import Request
  from pdjax.scheduler.policy_api import Views
  from pdjax.scheduler.policy_guard import GuardedRouter
  tier, w = HostTier(16), 0.25
  names = prefix_names("tenant:a", X + [7], 16)
  assert len(names) == 4
  workers = []
  for name, device_pages in (("A", 2), ("B", 0)):
    tables = BlockTables(16, 16)
    tables.enable_prefix_cache()
    tables.attach_host(tier, lambda *_: None)
    if device_pages:
      tables.allocate("s", 16 * device_pages)
      tables.cache.insert(names[:device_pages], tables.block_table("s"), "tenant:a", 0.0)
    workers.append(InstanceQueue(SimpleNamespace(name=name, tables=tables, host_page_weight=w),
                          "colocated", 4))
  for name in names:
    tier.offer(name, "tenant:a", "a", 0, writer="x", ready_s=9.0, now=0.0)
  assert [wk.prefix_credit(names, "tenant:a") for wk in workers] == [2 + 2 * w, 4 * w]
  assert [wk.prefix_credit(names, "tenant:b") for wk in workers] == [2, 0.0]
  req = Request(id="q", arrival_s=0.0, prompt_ids=X + [7], tenant="a")
  router = GuardedRouter(KvAwarePrefix(), Views(), "decode_router")   # (as the driver calls it)
  assert router.choose(req, workers[::-1]) is workers[0]


def test_report_shows_the_host_tier(tmp_path):
  from pdjax.metrics.report_sections import kv_cache_section
  on, _, _ = _run(tmp_path, 64)
  text = "\n".join(kv_cache_section(on["kv_cache"]))
  h = on["kv_cache"]["host_tier"]
  assert "## Host KV tier" in text
  assert (f"- Reload lookups: {h['lookups']}, with a hit: 1; pages reloaded: 4 "
          f"({h['loaded_bytes'] / (1 << 20):.2f} MiB") in text
  off, _, _ = _run(tmp_path, 0)
  assert "Host KV tier" not in "\n".join(kv_cache_section(off["kv_cache"]))


def test_trace_has_a_host_tier_track(tmp_path):
  from pdjax.metrics.trace import trace_events
  _, result, _ = _run(tmp_path, 64)
  track = [e for e in trace_events(requests=result.requests, steps=result.steps,
                                   role_switches=result.role_switches, samples=result.samples)
           if e.get("name") == "host tier pages"]
  assert [e["args"]["pages"] for e in track] == [s["host_tier_pages"] for s in result.samples]
  assert max(e["args"]["pages"] for e in track) >= 4
  binned = [e for e in trace_events(requests=result.requests, steps=result.steps,
                                    role_switches=result.role_switches,
                                    samples=result.samples, max_step_events=2)
            if e.get("name") == "host tier pages"]
  assert 1 <= len(binned) <= 2 and max(e["args"]["pages"] for e in binned) == max(
      s["host_tier_pages"] for s in result.samples)


def test_handoff_through_the_host_tier(tmp_path):
  """kv.host_tier_handoff=host, disaggregated: the prompt's full pages go through the host tier
  (and stay there), the partial last page over the link; same tokens as the direct transfer."""
  cfg_of = lambda handoff: sim_snapshots._config({
      "mode": "disaggregated", "workload.num_requests": 12, "workload.rate": 20.0,
      "kv.prefix_cache": True, "kv.host_tier_pages": 4096, "kv.host_tier_handoff": handoff})
  runs = {}
  for handoff in ("transfer", "host"):
    cfg = cfg_of(handoff)
    runs[handoff] = execute(cfg, config_lib.validate(cfg), "disaggregated", None, quiet=True)
  (direct, r_direct, _), (host, r_host, insts) = runs["transfer"], runs["host"]
  assert [r.output_ids for r in r_host.requests] == [r.output_ids for r in r_direct.requests]
  full_pages = sum((r.prompt_len - 1) // 16 for r in r_host.requests)
  assert host["kv_cache"]["host_tier"]["offloaded_pages"] == full_pages
  assert host["kv_cache"]["host_tier"]["loaded_bytes"] == full_pages * insts[0].kv_bytes(1)
  assert direct["kv_cache"]["host_tier"]["loaded_bytes"] == 0
  assert [t["bytes"] for t in r_host.transfers] == [t["bytes"] for t in r_direct.transfers]


@pytest.mark.slow
def test_the_engine_reloads_the_same_kv_it_evicted(tmp_path):
  """The real engine (tiny model, float32, greedy): X's 4 pages are gathered to host memory
  when evicted and scattered back for r4; tokens equal the run without the tier (which
  recomputes X) and the colocated no-cache reference."""
  off, r_off, _ = _run(tmp_path, 0, backend="jax")
  on, r_on, insts = _run(tmp_path, 64, backend="jax")
  assert [r.output_ids for r in r_on.requests] == [r.output_ids for r in r_off.requests]
  assert [r.cached_tokens for r in r_on.requests] == [0, 0, 0, 0, 64]
  host = on["kv_cache"]["host_tier"]
  assert (host["hit_pages"], host["hit_lookups"]) == (4, 1)
  assert host["loaded_bytes"] == 4 * insts[0].kv_bytes(1)
  assert insts[0].host_copies.stats["load_pages"] == 4
  assert host["load_s_total"] == insts[0].host_copies.stats["load_s"] > 0


@pytest.mark.slow
def test_the_engine_hands_off_through_the_host_tier(tmp_path):
  """kv.host_tier_handoff=host on the real engine, disaggregated: the prompts' full pages go
  through host memory (and stay in the tier), the partial last pages device to device; greedy
  tokens equal the direct transfer's."""
  from pdjax.engine.cluster import host_params
  runs = {}
  for handoff in ("transfer", "host"):
    cfg = sim_snapshots._config({
        "backend": "jax", "mode": "disaggregated", "workload.num_requests": 6,
        "workload.rate": 20.0, "cluster.prefill.instances": 1, "cluster.decode.instances": 1,
        "kv.prefix_cache": True, "kv.host_tier_pages": 512,
        "kv.host_tier_handoff": handoff})
    mcfg = config_lib.validate(cfg)
    params = host_params(mcfg, checkpoint="", seed=cfg.seed, dtype=cfg.model.dtype)
    runs[handoff] = execute(cfg, mcfg, "disaggregated", params, quiet=True)
  (direct, r_direct, _), (host, r_host, insts) = runs["transfer"], runs["host"]
  assert [r.status.value for r in r_host.requests] == ["finished"] * 6
  assert [r.output_ids for r in r_host.requests] == [r.output_ids for r in r_direct.requests]
  full_pages = sum((r.prompt_len - 1) // 16 for r in r_host.requests)
  assert host["kv_cache"]["host_tier"]["offloaded_pages"] == full_pages
  loaded = sum(i.host_copies.stats["load_pages"] for i in insts if i.role == "decode")
  assert loaded == full_pages and host["kv_pages_leaked"] == 0
  assert direct["kv_cache"]["host_tier"]["offloaded_pages"] == 0
