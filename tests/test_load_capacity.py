"""Correct when busy: a burst of asynchronous KV transfers never overfills a decode batch (the
decode slot is reserved at dispatch), and a preempted sequence longer than the prefill budget
is recomputed in pieces instead of stalling its instance. Real engine and simulator alike."""

import dataclasses

import pytest

from conftest import tiny_engine_options
from pdjax import serving
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
