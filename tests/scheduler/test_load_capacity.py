"""Correct when busy: a burst of asynchronous KV transfers never overfills a decode batch (the
decode slot is reserved at dispatch), and a preempted sequence longer than the prefill budget
is recomputed in pieces instead of stalling its instance. Real engine and simulator alike."""

import dataclasses

import pytest

from conftest import tiny_engine_options
from helpers.paths import FIXTURES
from pdjax.runner import serve_requests as serving
from pdjax.engine import programs
from pdjax.faults.injector import FaultInjector
from pdjax.faults.spec import FaultSpec
from pdjax.models.llama_config import PRESETS
from pdjax.request import Request, SamplingParams, Status
from pdjax.scheduler.clock import ManualClock
from pdjax.sim.instance import build_sim_instances, sim_transfer

BURST = 16


def _burst(n=BURST, prompt_len=12, max_new=6):
  return [Request(id=f"b{i}", arrival_s=0.0,
                  prompt_ids=[(5 * i + 3 * j) % 200 + 3 for j in range(prompt_len)],
                  sampling=SamplingParams(max_new_tokens=max_new), eos_ids=(2,))
          for i in range(n)]


def _decode_steps(result):
  return [s for s in result.steps if s["role"] == "decode" and s["kind"] == "decode"]


def _check_burst(result, instances):
  assert [r.status for r in result.requests] == [Status.FINISHED] * BURST
  used = {r.decode_instance for r in result.requests}
  assert used == {"decode-0", "decode-1"}
  assert max(s["num_seqs"] for s in _decode_steps(result)) == 4
  assert serving.kv_pages_leaked(instances) == 0


@pytest.mark.slow
def test_burst_of_async_transfers_fills_both_decode_instances_within_the_bucket(tiny_model):
  from pdjax.engine.cluster import build_instances
  cfg, params = tiny_model
  # one prefill step finishes 8 prompts at once: 8 transfers are dispatched in one pass
  opts = tiny_engine_options(decode_buckets=(1, 2, 4), num_pages=64, max_prefill_seqs=8)
  instances = build_instances([("prefill", 2, 1), ("decode", 2, 1)], cfg, params, opts)
  result = serving.serve("disaggregated", instances, _burst(), debug=True)
  _check_burst(result, instances)
  assert len(result.transfers) == BURST and all(t["ok"] for t in result.transfers)
  alone = [programs.reference_generate(params, cfg, r.prompt_ids, 6, eos_ids=(2,))
           for r in result.requests[:4]]
  assert [r.output_ids for r in result.requests[:4]] == alone


def _sim(tiers, opts, requests, faults=FaultSpec(), mode="disaggregated", **kw):
  clock = ManualClock()
  insts = build_sim_instances(tiers, PRESETS["tiny"], opts, hardware="a100", clock=clock)
  result = serving.serve(mode, insts, requests, clock=clock, transfer_fn=sim_transfer,
                         injector=FaultInjector(faults), **kw)
  return result, insts


def test_burst_with_delayed_transfers_on_the_simulator():
  opts = tiny_engine_options(decode_buckets=(1, 2, 4), num_pages=64, max_prefill_seqs=8)
  result, insts = _sim([("prefill", 2, 1), ("decode", 2, 1)], opts, _burst(),
                       FaultSpec(transfer_delay=("const", 0.05)), debug=True)
  _check_burst(result, insts)
  # Every transfer was in flight for the injected 50 ms while the loop kept stepping.
  assert all(r.transfer_end_s - r.transfer_start_s >= 0.05 for r in result.requests)


def test_sim_transfer_does_not_block_the_loop():
  """While one request's KV crosses a slow simulated link, a request already decoding keeps
  stepping: its decode tokens come while the other transfer flies (the old sim_transfer moved
  the clock past the whole transfer before any other step could run)."""
  clock = ManualClock()
  insts = build_sim_instances([("prefill", 1, 1), ("decode", 1, 1)], PRESETS["tiny"],
                              tiny_engine_options(decode_buckets=(1, 2, 4)), hardware="a100",
                              clock=clock, link_gbps=0.0001)
  first = Request(id="first", arrival_s=0.0, prompt_ids=[9] * 8,
                  sampling=SamplingParams(max_new_tokens=20))
  second = Request(id="second", arrival_s=0.05, prompt_ids=[4] * 8,
                   sampling=SamplingParams(max_new_tokens=2))
  result = serving.serve("disaggregated", insts, [first, second], clock=clock,
                         transfer_fn=sim_transfer)
  a, b = result.requests
  assert b.transfer_s > 0.2 and a.transfer_s == b.transfer_s   # same bytes, same slow link
  assert b.transfer_end_s - b.transfer_start_s == pytest.approx(b.transfer_s)
  # every decode token of `first` after its own landing came before `second` landed
  assert a.token_times[-1] < b.transfer_end_s
  assert a.token_times[1] == pytest.approx(a.transfer_end_s, abs=0.01)


def _pressure_requests():
  # The short request comes first, so the long one is the newest when the pool runs out:
  # it is preempted after ~12 tokens and must recompute 30 + 11 = 41 tokens > the 32 budget.
  short = Request(id="short", arrival_s=0.0, prompt_ids=[(3 * j) % 90 + 3 for j in range(20)],
                  sampling=SamplingParams(max_new_tokens=30))
  long = Request(id="long", arrival_s=0.0, prompt_ids=[(7 * j) % 90 + 5 for j in range(30)],
                 sampling=SamplingParams(max_new_tokens=40))
  return [short, long]


PRESSURE = dict(page_size=8, num_pages=10, max_model_len=96, prefill_buckets=(32,),
                decode_buckets=(4,))


@pytest.mark.slow
def test_preempted_long_sequence_is_recomputed_in_pieces(tiny_model):
  from pdjax.engine.cluster import build_instances
  cfg, params = tiny_model
  instances = build_instances([("colocated", 1, 1)], cfg, params,
                              tiny_engine_options(**PRESSURE))
  result = serving.serve("colocated", instances, _pressure_requests(), debug=True)
  short, long = result.requests
  assert (short.status, long.status) == (Status.FINISHED, Status.FINISHED), long.reason
  assert (short.preemptions, long.preemptions) == (0, 1)
  assert [r.output_ids for r in result.requests] == [
      programs.reference_generate(params, cfg, r.prompt_ids, r.sampling.max_new_tokens)
      for r in result.requests]
  assert max(s["num_tokens"] for s in result.steps) <= 32
  assert serving.kv_pages_leaked(instances) == 0


def test_preempted_long_sequence_on_the_simulator_matches_an_unpressured_run():
  tight, _ = _sim([("colocated", 1, 1)], tiny_engine_options(**PRESSURE), _pressure_requests(),
                  mode="colocated", debug=True)
  roomy, _ = _sim([("colocated", 1, 1)],
                  tiny_engine_options(**{**PRESSURE, "num_pages": 64}), _pressure_requests(),
                  mode="colocated")
  assert [r.status for r in tight.requests] == [Status.FINISHED] * 2
  assert [r.preemptions for r in tight.requests] == [0, 1]
  assert [r.preemptions for r in roomy.requests] == [0, 0]
  assert [r.output_ids for r in tight.requests] == [r.output_ids for r in roomy.requests]
  pieces = [s["num_tokens"] for s in tight.steps if s["kind"] == "prefill"]
  assert 32 in pieces[1:] and max(pieces) == 32


# ---- random load on the simulator: tight pools, small buckets, bursts, every policy mix ----

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from pdjax.scheduler import policies as policy_lib  # noqa: E402

ROUTERS = ["least_loaded", "round_robin", "kv_aware", "power_of_two"]


@st.composite
def load_schedules(draw):
  n = draw(st.integers(4, 14))
  reqs = [Request(id=f"q{i}", arrival_s=draw(st.sampled_from([0.0, 0.0, 0.001, 0.01])),
                  prompt_ids=[(i * 11 + j) % 90 + 3 for j in range(draw(st.integers(1, 60)))],
                  sampling=SamplingParams(max_new_tokens=draw(st.integers(1, 30))))
          for i in range(n)]
  mode = draw(st.sampled_from(["colocated", "disaggregated"]))
  names = dict(prefill_router=draw(st.sampled_from(ROUTERS)),
               decode_router=draw(st.sampled_from(ROUTERS)),
               path=draw(st.sampled_from(["always_disagg", "length_hybrid", "load_hybrid"])),
               admission="none",
               colocated_policy=draw(st.sampled_from(["prefill_first", "chunked_prefill"])),
               role_switch="none")
  engine = dict(page_size=8, max_model_len=96, num_pages=draw(st.sampled_from([12, 16, 64])),
                prefill_buckets=(draw(st.sampled_from([16, 32])),),
                decode_buckets=draw(st.sampled_from([(1,), (1, 2), (1, 2, 4)])),
                max_prefill_seqs=draw(st.sampled_from([2, 4])))
  delay = draw(st.sampled_from([(), ("const", 0.002), ("exp", 0.005)]))
  return reqs, mode, names, engine, FaultSpec(transfer_delay=delay)


def _serve_load(reqs, mode, names, engine, faults):
  opts = tiny_engine_options(**engine)
  tiers = ([("colocated", 2, 1)] if mode == "colocated" else
           [("prefill", 1, 1), ("decode", 2, 1)])
  budget = max(opts.prefill_buckets)
  policies = policy_lib.build(names, dict(token_budget=budget, chunk_budget=budget,
                                          max_prefill_seqs=opts.max_prefill_seqs,
                                          length_threshold=20))
  fresh = [dataclasses.replace(r, output_ids=[], token_times=[]) for r in reqs]
  return _sim(tiers, opts, fresh, faults, mode=mode, policies=policies, debug=True)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(load_schedules())
def test_random_load_finishes_everything_within_the_buckets(schedule):
  """Whatever the burst, pool and buckets: every request finishes (none is too long: long
  prompts and preempted sequences go in pieces), no step exceeds its bucket (the driver checks
  each dispatch, debug each turn), nothing leaks, and every output equals the same request's
  output on a roomy cluster (simulated tokens come from the KV pages read)."""
  reqs, mode, names, engine, faults = schedule
  result, insts = _serve_load(reqs, mode, names, engine, faults)
  roomy, _ = _serve_load(reqs, "colocated", {**names, "colocated_policy": "prefill_first"},
                         {**engine, "num_pages": 256, "decode_buckets": (16,)}, FaultSpec())
  assert [r.status for r in result.requests] == [Status.FINISHED] * len(reqs)
  assert [r.output_ids for r in result.requests] == [r.output_ids for r in roomy.requests]
  largest = max(engine["decode_buckets"])
  assert all(s["num_seqs"] <= largest for s in result.steps if s["kind"] == "decode")
  assert serving.kv_pages_leaked(insts) == 0


def test_a_preempted_request_does_not_block_a_prefill_that_holds_its_pages():
  """The example hypothesis found (tests/fixtures/preempt_deadlock.json): on decode-1,
  requests preempted mid-decode were put back at the very front of the queue, ahead of a
  recompute already holding 6 of the 12 pages (45 of 48 tokens done); the step policy stops at
  the first request it cannot admit, so that recompute never finished and never freed the
  pages the others waited for: 4 requests ended "scheduler stalled". A victim now queues
  behind the prefills under way."""
  import json
  import os
  with open(os.path.join(FIXTURES, "preempt_deadlock.json")) as f:
    data = json.load(f)
  reqs = [Request(id=r["id"], arrival_s=r["arrival_s"], prompt_ids=r["prompt_ids"],
                  sampling=SamplingParams(max_new_tokens=r["max_new_tokens"]))
          for r in data["requests"]]
  engine = {k: tuple(v) if isinstance(v, list) else v for k, v in data["engine"].items()}
  faults = FaultSpec(transfer_delay=tuple(data["transfer_delay"]), seed=data["fault_seed"])
  result, insts = _serve_load(reqs, data["mode"], data["names"], engine, faults)
  assert [r.status for r in result.requests] == [Status.FINISHED] * 14
  # 7: one more than before the livelock fix below: a decoding sequence that needs a page
  # now preempts the recompute under way on its instance before it preempts itself
  assert result.preemptions == 7
  assert serving.kv_pages_leaked(insts) == 0


THRASH = [  # (arrival_s, prompt length, max_new_tokens) of the schedule hypothesis found
    (0.0, 20, 29), (0.001, 28, 28), (0.0, 1, 2), (0.01, 17, 29), (0.001, 57, 15),
    (0.0, 12, 27), (0.0, 12, 8), (0.01, 15, 20), (0.001, 53, 9), (0.01, 56, 23),
    (0.01, 39, 5), (0.001, 60, 8), (0.0, 26, 21), (0.0, 1, 24)]


def test_two_sequences_that_need_most_of_the_pool_do_not_preempt_each_other_forever():
  """What hypothesis found (a livelock, the run never ended): on decode-1 (16 pages of 8) q4
  (57 + 15 tokens) and q11 (60 + 8) each need a 9th page; the one decoding preempted itself
  (no other sequence was running) while the other was being recomputed, holding 8 pages,
  then the other did the same: 17,000 preemptions and no token. A sequence that needs a page
  now preempts a prefill or recompute under way on its instance before itself, so the older
  sequence finishes and every request ends."""
  reqs = [Request(id=f"q{i}", arrival_s=a, prompt_ids=[(i * 11 + j) % 90 + 3 for j in range(n)],
                  sampling=SamplingParams(max_new_tokens=m))
          for i, (a, n, m) in enumerate(THRASH)]
  names = dict(prefill_router="kv_aware", decode_router="round_robin", path="length_hybrid",
               admission="none", colocated_policy="chunked_prefill", role_switch="none")
  engine = dict(page_size=8, max_model_len=96, num_pages=16, prefill_buckets=(16,),
                decode_buckets=(1, 2, 4), max_prefill_seqs=2)
  result, insts = _serve_load(reqs, "disaggregated", names, engine,
                              FaultSpec(transfer_delay=("exp", 0.005)))
  assert [r.status for r in result.requests] == [Status.FINISHED] * len(reqs)
  assert [len(r.output_ids) for r in result.requests] == [m for _, _, m in THRASH]
  assert sum(r.preemptions for r in result.requests) < 20
  assert serving.kv_pages_leaked(insts) == 0
