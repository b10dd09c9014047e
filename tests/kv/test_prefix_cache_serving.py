"""The prefix cache in serving: exact hits and tenant isolation through the real driver (on
simulated instances), and greedy tokens identical with the cache on and off on the real
engine."""

import json
import subprocess
import sys

import pytest

from pdjax.runner import serve_requests as serving
from pdjax.engine.options import EngineOptions
from pdjax.models.llama_config import PRESETS
from pdjax.request import Request, SamplingParams, Status
from pdjax.scheduler.clock import ManualClock
from pdjax.sim.instance import build_sim_instances, sim_transfer

PROMPT = [5 + i % 300 for i in range(70)]     # 4 full pages of 16 + 6 tokens


def _cluster(tiers, cache=True):
  """(clock, simulated instances of the tiny model) with 64-page pools, prefix cache on."""
  clock = ManualClock()
  opts = EngineOptions(page_size=16, num_pages=64, max_model_len=512, prefill_buckets=(512,),
                       max_prefill_seqs=4, decode_buckets=(16,))
  insts = build_sim_instances(tiers, PRESETS["tiny"], opts, hardware="a100", clock=clock)
  for inst in insts if cache else ():
    inst.tables.enable_prefix_cache()
  return clock, insts


def _run_cli(out, *flags):
  """python -m pdjax.run on the smoke config into `out`; fails the test on a non-zero exit."""
  proc = subprocess.run([sys.executable, "-m", "pdjax.run", "--config=configs/default.py:smoke",
                         "--config.progress=False", *flags, f"--workdir={out}"],
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]


def _serve(tenants, mode="disaggregated", shared_salt=""):
  tiers = ([("prefill", 1, 1), ("decode", 1, 1)] if mode == "disaggregated"
           else [("colocated", 1, 1)])
  clock, insts = _cluster(tiers)
  reqs = [Request(id=f"r{i}", arrival_s=1.0 * i, prompt_ids=list(PROMPT), tenant=tenant,
                  sampling=SamplingParams(max_new_tokens=3)) for i, tenant in enumerate(tenants)]
  result = serving.serve(mode, insts, reqs, clock=clock, transfer_fn=sim_transfer,
                         shared_salt=shared_salt)
  assert all(r.status == Status.FINISHED for r in result.requests)
  assert serving.kv_pages_leaked(insts) == 0
  return [r.cached_tokens for r in result.requests], insts


@pytest.mark.parametrize("mode", ["colocated", "disaggregated"])
def test_hits_are_exact_and_per_tenant(mode):
  cached, insts = _serve(["a", "a", "b", "b", "a"], mode)
  assert cached == [0, 64, 0, 64, 64]          # 4 full pages; tenant b starts cold
  prefill = insts[0]
  assert prefill.tables.cache.num_cached == 8  # 4 pages per tenant, nothing shared
  assert prefill.tables.cache.flush("tenant:a") == 4
  assert prefill.tables.cache.num_cached == 4


def test_shared_salt_opts_into_sharing():
  cached, _ = _serve(["a", "b", "c"], shared_salt="public")
  assert cached == [0, 64, 64]


@pytest.mark.slow
def test_greedy_tokens_identical_with_the_cache_on_and_off(tmp_path):
  """rag: a shared 32-token system prefix and repeated passages; 12 requests, all three runs
  of mode=compare on the real engine."""
  records = {}
  for on in (False, True):
    out = tmp_path / str(on)
    _run_cli(out, "--config.workload.preset=rag", "--config.workload.num_requests=12",
             f"--config.kv.prefix_cache={on}")
    records[on] = {m: [json.loads(l) for l in (out / m / "requests.jsonl").open()]
                   for m in ("colocated", "chunked", "disaggregated")}
  for m in ("colocated", "chunked", "disaggregated"):
    off, on = records[False][m], records[True][m]
    assert [r["output_ids"] for r in on] == [r["output_ids"] for r in off], m
    assert all(r["cached_tokens"] == 0 for r in off)
    # Hits depend on wall-clock routing; at most one cold request per instance (4 colocated,
    # 2 prefill) and a few concurrent ones leave at least 4 of 12 hitting the system prefix.
    assert sum(r["cached_tokens"] > 0 for r in on) >= 4, m
    assert all(r["cached_tokens"] % 16 == 0 for r in on)
    summary = json.loads((tmp_path / "True" / m / "summary.json").read_text())
    assert summary["kv_cache"]["saved_prefill_tokens"] == sum(r["cached_tokens"] for r in on)
    assert summary["kv_pages_leaked"] == 0


@pytest.mark.parametrize("router, third_goes_to", [("kv_aware_prefix", "colocated-1"),
                                                   ("least_loaded", "colocated-0")])
def test_kv_aware_prefix_routes_to_the_cached_prefix(router, third_goes_to):
  """r0 (prompt Q) lands on instance 0; r1 (prompt P) arrives while instance 0 is busy and
  lands on instance 1; r2 (prompt P again) arrives when both are idle: the prefix-aware router
  sends it where P is cached and it hits 64 tokens; least_loaded sends it to instance 0."""
  from pdjax.scheduler import policies as policy_lib
  clock, insts = _cluster([("colocated", 2, 1)])
  other = [400 + i for i in range(70)]
  reqs = [Request(id=f"r{i}", arrival_s=t, prompt_ids=list(p),
                  sampling=SamplingParams(max_new_tokens=3))
          for i, (t, p) in enumerate([(0.0, other), (1e-6, PROMPT), (1.0, PROMPT)])]
  names = dict(prefill_router=router, decode_router=router, path="always_disagg",
               admission="none", colocated_policy="prefill_first", role_switch="none")
  policies = policy_lib.build(names, dict(token_budget=512, max_prefill_seqs=4))
  result = serving.serve("colocated", insts, reqs, clock=clock, policies=policies)
  assert [r.prefill_instance for r in result.requests] == [
      "colocated-0", "colocated-1", third_goes_to]
  assert result.requests[2].cached_tokens == (64 if third_goes_to == "colocated-1" else 0)


def test_tenant_quota_rejects_at_admission_with_a_reason():
  """Quota 20 pages per tier; each request may grow to 70 + 3 tokens = 5 pages of 16. Four of
  tenant a's arrive together: the first four fit (20 pages), the fifth is rejected; tenant b
  is unaffected; once a's requests finish, a fits again."""
  clock, insts = _cluster([("prefill", 1, 1), ("decode", 1, 1)], cache=False)
  spec = [("a", 0.0)] * 5 + [("b", 0.0), ("a", 5.0)]
  reqs = [Request(id=f"r{i}", arrival_s=t, prompt_ids=list(PROMPT), tenant=tenant,
                  sampling=SamplingParams(max_new_tokens=3)) for i, (tenant, t) in enumerate(spec)]
  result = serving.serve("disaggregated", insts, reqs, clock=clock, transfer_fn=sim_transfer,
                         tenant_quota_pages=20)
  assert [r.status for r in result.requests] == [Status.FINISHED] * 4 + [
      Status.REJECTED, Status.FINISHED, Status.FINISHED]
  assert result.requests[4].reason == (
      "tenant 'a' over its KV quota on the prefill tier: 20 + 5 pages > 20")
  assert serving.kv_pages_leaked(insts) == 0


def _two_turns(second_extra, path="always_disagg", threshold=128):
  """Turn 1: PROMPT (70 tokens) in session s; turn 2 a second later: PROMPT + more tokens."""
  from pdjax.scheduler import policies as policy_lib
  clock, insts = _cluster([("prefill", 1, 1), ("decode", 1, 1)])
  prompts = [list(PROMPT), list(PROMPT) + [900 + i for i in range(second_extra)]]
  reqs = [Request(id=f"t{i}", arrival_s=float(i), prompt_ids=p, session="s", tenant="a",
                  sampling=SamplingParams(max_new_tokens=3)) for i, p in enumerate(prompts)]
  names = dict(prefill_router="least_loaded", decode_router="session_sticky", path=path,
               admission="none", colocated_policy="prefill_first", role_switch="none")
  policies = policy_lib.build(names, dict(token_budget=512, max_prefill_seqs=4,
                                          length_threshold=threshold))
  result = serving.serve("disaggregated", insts, reqs, clock=clock, transfer_fn=sim_transfer,
                         policies=policies)
  assert all(r.status == Status.FINISHED for r in result.requests)
  assert serving.kv_pages_leaked(insts) == 0
  return result, insts


def test_decode_side_hit_moves_only_the_missing_pages():
  result, insts = _two_turns(30)
  first, second = result.requests
  assert (first.cached_tokens, first.decode_cached_tokens) == (0, 0)
  # Turn 2 (100 tokens, 7 pages): its first 4 pages are cached on both tiers.
  assert (second.cached_tokens, second.decode_cached_tokens) == (64, 64)
  assert [t["bytes"] for t in result.transfers] == [insts[0].kv_bytes(5), insts[0].kv_bytes(3)]


def test_prefix_hybrid_keeps_a_mostly_cached_follow_up_on_the_decode_tier():
  result, _ = _two_turns(20, path="prefix_hybrid", threshold=40)
  first, second = result.requests
  assert (first.path, first.prefill_instance) == ("disaggregated", "prefill-0")
  # 90 tokens, 64 held by decode-0: 26 left to compute < 40 -> prefilled where it decodes.
  assert (second.path, second.prefill_instance, second.decode_instance) == (
      "colocated", "decode-0", "decode-0")
  assert second.cached_tokens == 64 and len(result.transfers) == 1


def test_isl_bounding_decides_on_the_decode_picks_cached_prefix():
  """Dynamo's rule on the same two turns (threshold 40, ratio 0.7): turn 1 has nothing cached
  (eff_isl 70, not < 40 nor < 49) and goes disaggregated; turn 2 (90 tokens, 64 cached on decode-0,
  the session-sticky pick) has eff_isl 26 < 40 and < 63: prefilled on decode-0. Each
  request's path_reason says so."""
  result, _ = _two_turns(20, path="isl_bounding", threshold=40)
  first, second = result.requests
  assert (first.path, second.path, second.prefill_instance) == (
      "disaggregated", "colocated", "decode-0")
  assert first.path_reason == {"policy": "isl_bounding", "choice": "disaggregated",
                               "decode_instance": "decode-0", "eff_isl": 70, "prompt": 70,
                               "why": "eff_isl >= length_threshold and >= isl_ratio x prompt"}
  assert second.path_reason == {"policy": "isl_bounding", "choice": "colocated",
                                "decode_instance": "decode-0", "eff_isl": 26, "prompt": 90,
                                "why": "eff_isl < length_threshold and < isl_ratio x prompt"}
  assert second.cached_tokens == 64 and len(result.transfers) == 1


@pytest.mark.slow
def test_multi_turn_tokens_identical_with_decode_side_hits(tmp_path):
  """agent_multiturn sessions, disaggregated, session-sticky decode routing and the prefix
  path decider: the same greedy tokens with the cache on and off, and the cache-on run moves
  fewer KV bytes because decode instances already hold earlier turns."""
  runs = {}
  for on in (False, True):
    out = tmp_path / str(on)
    _run_cli(out, "--config.mode=disaggregated", "--config.workload.preset=agent_multiturn",
             "--config.workload.num_requests=12",
             "--config.scheduler.decode_router=session_sticky",
             "--config.scheduler.path=prefix_hybrid", "--config.scheduler.length_threshold=8",
             f"--config.kv.prefix_cache={on}")
    runs[on] = ([json.loads(l) for l in (out / "requests.jsonl").open()],
                json.loads((out / "summary.json").read_text()))
  (off, off_summary), (on, on_summary) = runs[False], runs[True]
  assert [r["output_ids"] for r in on] == [r["output_ids"] for r in off]
  assert on_summary["kv_cache"]["decode_hit_tokens"] > 0
  assert on_summary["kv_transfer"]["bytes"] < off_summary["kv_transfer"]["bytes"]
  assert all(r["status"] == "finished" for r in on) and on_summary["kv_pages_leaked"] == 0


def test_flush_tenant_leaves_nothing_to_hit_on_any_instance():
  """After serving tenant a and b (disaggregated: both tiers cache), flushing a forgets every
  page named under a's salt on both instances; a's next identical request hits nothing on
  either tier, while b's still hits."""
  cached, insts = _serve(["a", "b"])
  assert serving.flush_tenant(insts, "a") == 4 + 4      # prefill-0 and decode-0: 4 pages each
  assert all(s != "tenant:a" for inst in insts for _, s in inst.tables.cache._entry.values())
  clock = insts[0].clock
  reqs = [Request(id=f"x{i}", arrival_s=clock.now() + i, prompt_ids=list(PROMPT), tenant=t,
                  sampling=SamplingParams(max_new_tokens=3)) for i, t in enumerate("ab")]
  result = serving.serve("disaggregated", insts, reqs, clock=clock, transfer_fn=sim_transfer)
  assert [(r.cached_tokens, r.decode_cached_tokens) for r in result.requests] == [
      (0, 0), (64, 64)]


def test_report_has_a_prefix_cache_section_only_when_on():
  from pdjax.metrics.report_sections import extra_sections
  kv = {"enabled": True, "hit_rate_tokens": 0.5, "hit_rate_requests": 0.75,
        "saved_prefill_tokens": 640, "decode_hit_tokens": 128, "evictions": 3, "expiries": 1,
        "cached_pages_at_end": 9}
  assert extra_sections({"kv_cache": kv}) == [
      "## Prefix cache", "",
      "- Prompt tokens served from a prefill-side cache: 50.0% (640 tokens not recomputed); "
      "requests with a hit: 75.0%",
      "- Prompt tokens a decode instance already held (not transferred): 128",
      "- Cached pages evicted for space (lru): 3; expired: 1; still cached at the end: 9", ""]
  assert extra_sections({"kv_cache": {**kv, "enabled": False}}) == []
