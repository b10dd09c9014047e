"""The simulator's re-mesh accounting (sim/remesh.py, scheduler/remesh.py) against phase costs
computed by hand: reshard = the weight bytes each device lacks over the link, compile = the
configured load time, migrate = the slowest moved request's KV over the link, drain = the rest
of the step in flight; tokens equal the run without re-meshing."""

import dataclasses

import pytest

from pdjax.engine.options import EngineOptions
from pdjax.models.llama_config import LlamaConfig
from pdjax.request import Request, SamplingParams, Status
from pdjax.runner import serve_requests as serving
from pdjax.scheduler import policies as policy_lib
from pdjax.scheduler.clock import ManualClock
from pdjax.sim.hardware import Hardware
from pdjax.sim.instance import SimInstance, sim_transfer
from pdjax.sim.remesh import SimRemeshBuilder
from pdjax.sim.roofline import RooflineCost

# Round numbers: 4 layers, 800 bytes of KV per token, a 1e9 B/s link, no latency.
CFG = LlamaConfig(vocab_size=1000, hidden_size=100, intermediate_size=200, num_layers=4,
                  num_heads=4, num_kv_heads=2, head_dim=25)
CHIP = Hardware("test", bf16_flops=1e12, hbm_bytes=1e9, hbm_bytes_per_s=1e9,
                link_bytes_per_s=1e9)
OPTS = EngineOptions(page_size=16, num_pages=256, max_model_len=512, prefill_buckets=(512,),
                     max_prefill_seqs=4, decode_buckets=(16,))
COMPILE_S = 0.25
NAMES = dict(prefill_router="least_loaded", decode_router="least_loaded", path="always_disagg",
             admission="none", colocated_policy="prefill_first", role_switch="remesh")


def _cost(tp):
  return RooflineCost(CFG, CHIP, tp=tp, dtype_bytes=2, eff_flops=1.0, eff_bw=1.0,
                      step_overhead_s=0.0, link_latency_s=0.0)


def _serve(schedule):
  clock = ManualClock()
  make = lambda name, role, tp, pages: SimInstance(
      name, role, _cost(tp), dataclasses.replace(OPTS, num_pages=pages), clock=clock,
      vocab_size=1000, eos_ids=(2,), num_layers=4)
  insts = [make("prefill-0", "prefill", 1, 256), make("decode-0", "decode", 2, 512)]
  moves = []

  def transfer(src, src_pages, dst, dst_pages):
    t = sim_transfer(src, src_pages, dst, dst_pages)
    if src.role == dst.role:        # a migration (P -> D transfers cross tiers)
      moves.append((len(src_pages), t.seconds))
    return t
  reqs = [Request(id=f"r{i}", arrival_s=0.0, prompt_ids=[5 + i] * (40 + 30 * i),
                  sampling=SamplingParams(max_new_tokens=60), eos_ids=())
          for i in range(6)]
  builder = SimRemeshBuilder(make, _cost(1).weight_bytes, COMPILE_S)
  policies = policy_lib.build(NAMES, dict(token_budget=512, max_prefill_seqs=4,
                                          remesh_schedule=schedule), seed=0)
  result = serving.serve("disaggregated", insts, reqs, clock=clock, transfer_fn=transfer,
                         policies=policies, remesh_builder=builder)
  assert [r.status for r in result.requests] == [Status.FINISHED] * 6
  assert serving.kv_pages_leaked(result.instances) == 0
  return result, moves


def test_split_and_merge_phases_equal_the_hand_computed_costs():
  base, _ = _serve("")
  result, moves = _serve("decode:2x1@0.05,decode:1x2@0.2")
  assert {r.id: r.output_ids for r in result.requests} == \
      {r.id: r.output_ids for r in base.requests}
  split, merge = result.remesh_events
  weights = _cost(1).weight_bytes
  assert weights == (4 * (100 * 100 + 2 * 100 * 50 + 100 * 100 + 3 * 100 * 200)
                     + 2 * 100 * 1000) * 2          # the layers' matmuls, embedding and head
  # split TP2 -> 2 x TP1: each device lacks half the weights; merge: each holds its shard
  assert split["phases_s"]["reshard"] == pytest.approx(weights / 2 / 1e9)
  assert merge["phases_s"]["reshard"] == 0.0
  for ev in (split, merge):
    assert ev["phases_s"]["compile"] == COMPILE_S
    assert ev["phases_s"]["rejoin_wait"] == 0.0
  # every request was decoding at both switches and moved with its KV (800 B per token,
  # 16-token pages), the phase as long as the slowest move
  assert (split["migrated"], merge["migrated"]) == (6, 6)
  per_switch = [moves[:6], moves[6:]]
  for ev, mv in zip((split, merge), per_switch):
    assert all(s == pytest.approx(pages * 16 * 800 / 1e9) for pages, s in mv)
    assert ev["phases_s"]["migrate"] == pytest.approx(max(s for _, s in mv))
  # drain: the old instances' steps in flight at the switch end first
  for ev in (split, merge):
    ends = [s["end_s"] for s in result.steps
            if s["instance"] in ev["instances_from"] and s["start_s"] < ev["t_s"] < s["end_s"]]
    assert ev["phases_s"]["drain"] == pytest.approx(max(ends, default=ev["t_s"]) - ev["t_s"])
    assert ev["total_s"] == pytest.approx(sum(ev["phases_s"].values()))


def test_merge_of_full_instances_waits_for_slots():
  """A merge of two full decode instances into one with the same slot cap: the sequences over
  the cap keep their KV on the new instance and join its batch as slots free (no step over the
  largest bucket, nothing recomputed, the same tokens as without re-meshing)."""
  def serve(schedule):
    clock = ManualClock()
    opts = dataclasses.replace(OPTS, decode_buckets=(4,))
    make = lambda name, role, tp, pages: SimInstance(
        name, role, _cost(tp), dataclasses.replace(opts, num_pages=pages), clock=clock,
        vocab_size=1000, eos_ids=(2,), num_layers=4)
    insts = [make("prefill-0", "prefill", 1, 256), make("decode-0", "decode", 1, 256),
             make("decode-1", "decode", 1, 256)]
    reqs = [Request(id=f"r{i}", arrival_s=0.0, prompt_ids=[5 + i] * (40 + 10 * i),
                    sampling=SamplingParams(max_new_tokens=40 + 5 * i), eos_ids=())
            for i in range(8)]
    policies = policy_lib.build(NAMES, dict(token_budget=512, max_prefill_seqs=4,
                                            remesh_schedule=schedule), seed=0)
    result = serving.serve("disaggregated", insts, reqs, clock=clock,
                           transfer_fn=sim_transfer, policies=policies,
                           remesh_builder=SimRemeshBuilder(make, _cost(1).weight_bytes,
                                                           COMPILE_S))
    assert [r.status for r in result.requests] == [Status.FINISHED] * 8
    assert serving.kv_pages_leaked(result.instances) == 0
    return result
  base = serve("")
  result = serve("decode:1x2@0.05")
  assert {r.id: r.output_ids for r in result.requests} == \
      {r.id: r.output_ids for r in base.requests}
  merge, = result.remesh_events
  assert merge["ok"] and merge["migrated"] == 8 and merge["recomputed"] == 0


def test_kv_held_through_a_remesh_keeps_its_lease():
  """Prompts prefilled while the decode tier re-meshes (0.25 s of compile) wait in the
  transfer queue longer than their 0.1 s KV lease: no decode instance could pull them, so the
  lease restarts when the switch ends and every request finishes (without it: failed, "KV
  lease of 0.1 s expired")."""
  clock = ManualClock()
  make = lambda name, role, tp, pages: SimInstance(
      name, role, _cost(tp), dataclasses.replace(OPTS, num_pages=pages), clock=clock,
      vocab_size=1000, eos_ids=(2,), num_layers=4)
  insts = [make("prefill-0", "prefill", 1, 256), make("decode-0", "decode", 2, 512)]
  reqs = [Request(id=f"r{i}", arrival_s=0.06 + 0.01 * i, prompt_ids=[5 + i] * 40,
                  sampling=SamplingParams(max_new_tokens=8), eos_ids=()) for i in range(4)]
  policies = policy_lib.build(NAMES, dict(token_budget=512, max_prefill_seqs=4,
                                          remesh_schedule="decode:2x1@0.05"), seed=0)
  result = serving.serve("disaggregated", insts, reqs, clock=clock, transfer_fn=sim_transfer,
                         policies=policies, lease_s=0.1,
                         remesh_builder=SimRemeshBuilder(make, _cost(1).weight_bytes,
                                                         COMPILE_S))
  assert [(r.status, r.reason) for r in reqs] == [(Status.FINISHED, "")] * 4
  ev, = result.remesh_events
  joined = ev["t_s"] + ev["total_s"]
  assert ev["ok"] and ev["total_s"] > 0.1
  assert all(r.prefill_end_s + 0.1 < joined for r in reqs)   # held past the lease
  assert result.faults["pages_reclaimed_by_lease"] == 0
  assert serving.kv_pages_leaked(result.instances) == 0
