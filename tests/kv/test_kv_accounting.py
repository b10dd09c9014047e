"""KV as a managed resource, accounted for: internal fragmentation and pages per tenant in
the block tables, LFU eviction, hot prefixes, scheduled tenant flushes, and how they reach
summary.json, report.md, the timeline and the trace."""

import json

import pytest

from pdjax import config as config_lib
from pdjax.runner import serve_requests as serving
from pdjax.kv.pages import BlockTables
from pdjax.metrics.kv_cache import kv_cache_summary
from pdjax.metrics.report_sections import extra_sections
from pdjax.metrics.trace import pool_counters
from pdjax.request import Request, SamplingParams, Status
from pdjax.sim.instance import sim_transfer
from test_prefix_cache_serving import PROMPT, _cluster, _run_cli


def test_unused_slots_and_pages_per_owner_are_exact():
  bt = BlockTables(num_pages=8, page_size=4)
  bt.allocate("a", 5, owner="t1")                 # 2 pages, 3 slots unused
  assert (bt.num_unused_slots, dict(bt.pages_by_owner)) == (3, {"t1": 2})
  bt.extend("a", 6)                               # same pages, one more token
  assert bt.num_unused_slots == 2
  bt.extend("a", 9)                               # a third page, 3 unused in it
  assert bt.num_unused_slots == 3
  bt.allocate("b", 4, owner="t2")                 # a full page
  assert (bt.num_unused_slots, dict(bt.pages_by_owner)) == (3, {"t1": 3, "t2": 1})
  bt.check_invariants()
  bt.free("a")
  assert (bt.num_unused_slots, dict(bt.pages_by_owner)) == (0, {"t1": 0, "t2": 1})
  assert bt.peak_pages_by_owner == {"t1": 3, "t2": 1}
  bt.check_invariants()


def _cached_tables(eviction):
  """A 6-page pool of 1-token pages holding three idle cached one-page prefixes x, y, z
  (pages 0, 1, 2), named in that order; y then x are hit once more (x most recently)."""
  bt = BlockTables(num_pages=6, page_size=1)
  bt.enable_prefix_cache(eviction=eviction)
  for i, tok in enumerate((7, 8, 9)):
    bt.allocate_prefix(f"s{i}", [tok, 0], 2, "s")
    bt.cache_computed(f"s{i}", 2)
    bt.free(f"s{i}", now=float(i))
  for j, tok in enumerate((8, 7)):
    assert bt.allocate_prefix(f"h{j}", [tok, 0], 2, "s", now=10.0 + j) == 1
    bt.free(f"h{j}", now=10.0 + j)
  return bt


@pytest.mark.parametrize("eviction,survivors", [
    ("lru", [0, 1]),      # z (page 2) was used least recently
    ("lfu", [0, 1]),      # z was never hit
])
def test_eviction_policies_pick_their_victim(eviction, survivors):
  bt = _cached_tables(eviction)
  assert bt.cache.evict(1) == 1
  assert sorted(bt.cache.cached_pages()) == survivors
  bt.check_invariants()


def test_lfu_keeps_a_hot_page_that_lru_would_drop():
  """x is hit 3 times long ago, y once recently: LRU drops x, LFU drops y."""
  result = {}
  for eviction in ("lru", "lfu"):
    bt = BlockTables(num_pages=4, page_size=1)
    bt.enable_prefix_cache(eviction=eviction)
    for i, tok in enumerate((7, 8)):
      bt.allocate_prefix(f"s{i}", [tok, 0], 2, "s")
      bt.cache_computed(f"s{i}", 2)
      bt.free(f"s{i}")
    for j, tok in enumerate((7, 7, 7, 8)):
      bt.allocate_prefix(f"h{j}", [tok, 0], 2, "s")
      bt.free(f"h{j}")
    bt.cache.evict(1)
    result[eviction] = sorted(bt.cache.cached_pages())
  assert result == {"lru": [1], "lfu": [0]}


def test_unknown_eviction_policy_is_refused():
  with pytest.raises(ValueError, match=r"eviction must be one of \('lru', 'lfu'\), got 'mru'"):
    BlockTables(num_pages=4, page_size=1).enable_prefix_cache(eviction="mru")


def _serve_flushed(schedule):
  """Tenants a, b, a, b with one 70-token prompt at t = 0, 1, 2, 3, colocated; `schedule` of
  tenant flushes."""
  clock, insts = _cluster([("colocated", 1, 1)])
  reqs = [Request(id=f"r{i}", arrival_s=1.0 * i, prompt_ids=list(PROMPT), tenant=t,
                  sampling=SamplingParams(max_new_tokens=3)) for i, t in enumerate("abab")]
  result = serving.serve("colocated", insts, reqs, clock=clock, transfer_fn=sim_transfer,
                         flush_schedule=schedule)
  assert all(r.status == Status.FINISHED for r in result.requests)
  assert serving.kv_pages_leaked(insts) == 0
  return result, insts


def test_a_scheduled_flush_forgets_the_tenant_from_then_on():
  result, insts = _serve_flushed(((1.5, "a"),))
  assert [r.cached_tokens for r in result.requests] == [0, 0, 0, 64]   # a's t=2 request: cold
  assert [(f["t_s"], f["tenant"], f["pages"]) for f in result.flushes] == [(1.5, "a", 4)]
  kv = kv_cache_summary(result.requests, insts, samples=result.samples, flushes=result.flushes)
  assert kv["hot_prefixes"] == [{"salt": "tenant:b", "prefix": kv["hot_prefixes"][0]["prefix"],
                                 "pages": 4, "hits": 1, "saved_tokens": 64}]
  assert kv["pages_per_tenant"] == {"a": {"colocated": 5}, "b": {"colocated": 5}}
  # 70 prompt tokens in 5 pages (10 slots unused), growing to 72: a sample per step.
  assert 0 < kv["internal_fragmentation"] < 10 / 80


def test_a_flush_scheduled_after_the_last_request_runs_at_the_end():
  result, insts = _serve_flushed(((1e6, "b"),))
  assert [r.cached_tokens for r in result.requests] == [0, 0, 64, 64]
  assert [(f["tenant"], f["pages"]) for f in result.flushes] == [("b", 4)]
  assert insts[0].tables.cache.num_cached == 4    # only a's pages are left


@pytest.mark.parametrize("value,error", [
    ("a@x", "kv.flush_tenants='a@x' item 'a@x' is not tenant@seconds (seconds >= 0)"),
    ("@3", "kv.flush_tenants='@3' item '@3' is not tenant@seconds (seconds >= 0)"),
    ("a@-1", "kv.flush_tenants='a@-1' item 'a@-1' is not tenant@seconds (seconds >= 0)"),
])
def test_bad_flush_schedule_is_one_line(value, error):
  cfg = config_lib.load_config_module("configs/default.py").get_config()
  cfg.kv.flush_tenants = value
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.flush_schedule(cfg)
  assert str(e.value) == error


def test_flush_schedule_parses_and_sorts():
  cfg = config_lib.load_config_module("configs/default.py").get_config()
  cfg.kv.flush_tenants = " b@2.5, a@1 ,"
  assert config_lib.flush_schedule(cfg) == ((1.0, "a"), (2.5, "b"))


def test_report_kv_sections():
  kv = {"enabled": True, "eviction": "lfu", "hit_rate_tokens": 0.5, "hit_rate_requests": 0.5,
        "saved_prefill_tokens": 64, "decode_hit_tokens": 0, "evictions": 2, "expiries": 0,
        "cached_pages_at_end": 4, "internal_fragmentation": 0.125,
        "pages_per_tenant": {"a": {"decode": 3, "prefill": 5}, "b": {"prefill": 2}},
        "flushes": [{"t_s": 1.5, "tenant": "a", "pages": 4}],
        "hot_prefixes": [{"salt": "tenant:b", "prefix": "00ff", "pages": 4, "hits": 1,
                          "saved_tokens": 64}]}
  assert extra_sections({"kv_cache": kv}) == [
      "## KV pages", "",
      "- Internal fragmentation (allocated slots no token occupies): 12.5%", "",
      "Peak pages a tenant held on one instance:", "",
      "| tenant | decode | prefill |", "| --- | ---: | ---: |",
      "| a | 3 | 5 |", "| b | 0 | 2 |", "",
      "## Prefix cache", "",
      "- Prompt tokens served from a prefill-side cache: 50.0% (64 tokens not recomputed); "
      "requests with a hit: 50.0%",
      "- Prompt tokens a decode instance already held (not transferred): 0",
      "- Cached pages evicted for space (lfu): 2; expired: 0; still cached at the end: 4",
      "- Tenant 'a' flushed at 1.500 s: 4 cached pages forgotten", "",
      "Hot prefixes (deepest page a hit matched):", "",
      "| prefix | salt | pages | hits | tokens saved |", "| --- | --- | ---: | ---: | ---: |",
      "| 00ff | tenant:b | 4 | 1 | 64 |", ""]


def test_pool_occupancy_is_a_counter_track_per_instance():
  samples = [{"t": 0.5, "instance": "p0", "kv_pages_used": 3, "kv_pages_cached": 2},
             {"t": 1.0, "instance": "d0", "kv_pages_used": 7}]
  assert pool_counters(samples) == [
      {"name": "kv pages p0", "ph": "C", "ts": 500000.0, "pid": 1,
       "args": {"used": 3, "cached_idle": 2}},
      {"name": "kv pages d0", "ph": "C", "ts": 1000000.0, "pid": 1,
       "args": {"used": 7, "cached_idle": 0}}]


def test_cli_run_reports_flushes_tenants_and_fragmentation(tmp_path):
  """The sim backend through the CLI: a flush from config, pages per tenant, fragmentation
  and the pool counters in trace.json."""
  _run_cli(tmp_path, "--config.backend=sim", "--config.mode=colocated",
           "--config.workload.preset=agent_multiturn", "--config.workload.num_requests=40",
           "--config.workload.tenants=3", "--config.kv.prefix_cache=True",
           "--config.kv.eviction=lfu",
           "--config.kv.flush_tenants=tenant-0@0.5")
  summary = json.loads((tmp_path / "summary.json").read_text())
  reqs = [json.loads(l) for l in (tmp_path / "requests.jsonl").open()]
  kv = summary["kv_cache"]
  assert kv["eviction"] == "lfu"
  assert [f["tenant"] for f in kv["flushes"]] == ["tenant-0"]
  assert sorted(kv["pages_per_tenant"]) == sorted({r["tenant"] for r in reqs})
  assert 0 < kv["internal_fragmentation"] < 1
  assert sum(h["hits"] for h in kv["hot_prefixes"]) <= sum(r["cached_tokens"] > 0 for r in reqs)
  trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
  assert any(e["ph"] == "C" and e["name"].startswith("kv pages ") for e in trace)
  report = (tmp_path / "report.md").read_text()
  assert "## KV pages" in report and "flushed at" in report


def test_mooncake_hash_ids_become_cache_hits(tmp_path):
  """Rows naming the same hash_ids block get the same synthesized tokens, so the prefix cache
  hits them: row 2 shares block 0 with row 1 (both cut to fit max_model_len 512), row 4 is a
  300-token prefix of block 0; rows with other blocks start cold. The prefix-aware router
  sends the rows sharing block 0 where it is cached (least_loaded's ties rotate over the
  idle instances, so it would spread them)."""
  _run_cli(tmp_path, "--config.backend=sim", "--config.mode=colocated",
           "--config.workload.kind=mooncake",
           "--config.workload.path=tests/fixtures/mooncake_small.jsonl",
           "--config.kv.prefix_cache=True", "--config.scheduler.prefill_router=kv_aware_prefix")
  reqs = [json.loads(l) for l in (tmp_path / "requests.jsonl").open()]
  # 492 = 512 - 20 new tokens; row 2 (500 tokens) reuses the 30 full pages row 1 computed,
  # row 4 (300 tokens) all 18 of its reusable full pages ((300 - 1) // 16).
  assert [(r["prompt_len"], r["cached_tokens"]) for r in reqs] == [
      (492, 0), (500, 480), (100, 0), (300, 288), (40, 0)]
