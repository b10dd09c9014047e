"""Re-meshing a tier live (scheduler/remesh.py) on the fake engine: the schedule's parsing and
errors, a merge and a split mid-run (requests decoding), both drain policies, a failed build,
and the phases' accounting on the virtual clock."""

import pytest

from pdjax.request import Status
from pdjax.scheduler import policies as policy_lib
from pdjax.scheduler.clock import ManualClock
from pdjax.scheduler.driver import Driver
from pdjax.errors import DeviceError
from pdjax.scheduler.policies.remesh import parse_schedule, schedule_error
from helpers.fake_engine import OPTS, FakeInstance, InstanceQueue, _req, ok_transfer

NAMES = dict(prefill_router="least_loaded", decode_router="least_loaded", path="always_disagg",
             admission="none", colocated_policy="prefill_first", role_switch="remesh")
RESHARD_S, COMPILE_S = 0.05, 0.1


class FakeBuilder:
  """New FakeInstances at `tp`, their pools the old ones' pages shared out; phases modelled."""

  def __init__(self, clock, fail=False):
    self.clock, self.fail, self.built, self.released = clock, fail, [], []

  def build(self, old, role, count, tp, names):
    if self.fail:
      raise DeviceError("out of memory while resharding")
    pages = sum(o.tables.allocator.num_pages for o in old) // count
    new = []
    for name in names:
      inst = FakeInstance(name, self.clock, num_pages=pages)
      inst.tp = tp
      new.append(inst)
    self.built.append([i.name for i in new])
    return new, {"reshard_s": RESHARD_S, "compile_s": COMPILE_S}

  def release(self, old):
    self.released.append([o.name for o in old])


def _driver(schedule, drain="migrate", fail=False, decode=2, decode_tp=1):
  clock = ManualClock()
  ps = [InstanceQueue(FakeInstance("prefill-0", clock), "prefill")]
  ds = []
  for i in range(decode):
    inst = FakeInstance(f"decode-{i}", clock)
    inst.tp = decode_tp
    ds.append(InstanceQueue(inst, "decode"))
  builder = FakeBuilder(clock, fail)
  policies = policy_lib.build(NAMES, dict(token_budget=16, max_prefill_seqs=4,
                                          remesh_schedule=schedule), seed=0)
  driver = Driver("disaggregated", ps + ds, options=OPTS, clock=clock, transfer_fn=ok_transfer,
                  policies=policies, remesh_builder=builder, remesh_drain=drain)
  return driver, builder, ps + ds


def _check_done(result, reqs, max_new=8):
  assert [r.status for r in reqs] == [Status.FINISHED] * len(reqs)
  for r in reqs:   # the fake engine's token after length n is 100 + n
    assert r.output_ids == list(range(100 + r.prompt_len, 100 + r.prompt_len + max_new))
  for inst in result.instances:
    assert inst.tables.num_used_pages == 0, inst.name


def test_schedule_parses_and_rejects_in_one_line():
  assert parse_schedule("decode:2x1@4, decode:1x2@1.5") == [(1.5, "decode", 1, 2),
                                                            (4.0, "decode", 2, 1)]
  with pytest.raises(ValueError) as e:
    parse_schedule("decode:1x2")
  assert str(e.value) == ("scheduler.remesh_schedule entry 'decode:1x2' is not "
                          "'<prefill|decode>:<instances>x<tp>@<seconds>' (e.g. 'decode:1x2@1.5')")
  devices = {"prefill": 1, "decode": 2}
  assert schedule_error("decode:1x2@1,decode:2x1@2", devices, (1, 2)) is None
  assert schedule_error("decode:1x4@1", devices, (1, 2, 4)) == (
      "scheduler.remesh_schedule entry 'decode:1x4' needs 4 devices; the decode tier has 2")
  assert schedule_error("prefill:1x1@1,decode:1x2@1", devices, (1,)) == (
      "scheduler.remesh_schedule entry 'decode:1x2': tp 2 is not one the model allows ([1])")


def test_merge_then_split_mid_decode_migrates_kv_and_loses_nothing():
  driver, builder, workers = _driver("decode:1x2@0.25,decode:2x1@0.6")
  reqs = [_req(i, 4, 8, arrival=0.05 * i) for i in range(8)]
  result = driver.run(reqs)
  _check_done(result, reqs)
  assert builder.built == [["decode-m1-0"], ["decode-m2-0", "decode-m2-1"]]
  assert builder.released == [["decode-0", "decode-1"], ["decode-m1-0"]]
  first, second = result.remesh_events
  assert (first["from"], first["to"], first["reason"], first["ok"]) == ("2x1", "1x2",
                                                                        "scheduled", True)
  assert first["instances_from"] == ["decode-0", "decode-1"]
  assert first["instances_to"] == ["decode-m1-0"]
  assert (second["from"], second["to"], second["instances_to"]) == (
      "1x2", "2x1", ["decode-m2-0", "decode-m2-1"])
  for ev in (first, second):
    assert ev["phases_s"]["reshard"] == RESHARD_S and ev["phases_s"]["compile"] == COMPILE_S
    assert ev["phases_s"]["migrate"] == 0.0     # ok_transfer lands at once
    # (rejoin_wait: the fake engine's steps move the clock only when collected, past the
    # rejoin's due time)
    assert ev["total_s"] == pytest.approx(sum(ev["phases_s"].values()))
    assert ev["migrated"] > 0 and ev["recomputed"] == 0
  # requests that were decoding at the first switch moved to the merged instance
  moved = [r for r in reqs if r.decode_start_s < first["t_s"] and
           r.finish_s > first["t_s"] + first["total_s"]]
  assert len(moved) == first["migrated"]
  old = [w for w in driver.workers if w.name in ("decode-0", "decode-1", "decode-m1-0")]
  assert all(w.retired and w.dead and not w.running for w in old)
  assert driver.tier("decode") == [w for w in driver.workers if w.name.startswith("decode-m2")]


def test_finish_drain_lets_old_instances_finish_their_requests():
  driver, builder, _ = _driver("decode:1x2@0.25", drain="finish")
  reqs = [_req(i, 4, 8, arrival=0.05 * i) for i in range(8)]
  result = driver.run(reqs)
  _check_done(result, reqs)
  ev, = result.remesh_events
  assert ev["migrated"] == 0 and ev["requeued"] == 0 and ev["ok"]
  t_join = ev["t_s"] + ev["total_s"]
  for r in reqs:   # nothing moved: each decoded where its KV first landed
    if r.decode_start_s >= t_join:
      assert r.decode_instance == "decode-m1-0"
    if r.decode_start_s < ev["t_s"]:
      assert r.decode_instance in ("decode-0", "decode-1")
  assert any(r.decode_instance == "decode-m1-0" for r in reqs)


def test_a_failed_build_leaves_the_old_instances_serving():
  driver, builder, workers = _driver("decode:1x2@0.25", fail=True)
  reqs = [_req(i, 4, 8, arrival=0.05 * i) for i in range(8)]
  result = driver.run(reqs)
  _check_done(result, reqs)
  ev, = result.remesh_events
  assert ev["ok"] is False
  assert ev["error"] == "DeviceError: out of memory while resharding"
  assert builder.released == []
  assert driver.tier("decode") == workers[1:]
  assert {r.decode_instance for r in reqs} == {"decode-0", "decode-1"}


def test_prefill_remesh_holds_arrivals_until_the_new_instances_join():
  clock = ManualClock()
  ps = [InstanceQueue(FakeInstance(f"prefill-{i}", clock), "prefill") for i in range(2)]
  ds = [InstanceQueue(FakeInstance("decode-0", clock), "decode")]
  builder = FakeBuilder(clock)
  policies = policy_lib.build(NAMES, dict(token_budget=16, max_prefill_seqs=4,
                                          remesh_schedule="prefill:1x2@0.15"), seed=0)
  driver = Driver("disaggregated", ps + ds, options=OPTS, clock=clock, transfer_fn=ok_transfer,
                  policies=policies, remesh_builder=builder)
  reqs = [_req(i, 4, 4, arrival=0.1 * i) for i in range(5)]
  result = driver.run(reqs)
  _check_done(result, reqs, max_new=4)
  ev, = result.remesh_events
  joined = ev["t_s"] + ev["total_s"]
  held = [r for r in reqs if ev["t_s"] < r.arrival_s < joined]
  assert held and all(r.prefill_instance == "prefill-m1-0" for r in held)
  assert all(r.prefill_start_s >= joined for r in held)
  assert [r.status for r in reqs].count(Status.REJECTED) == 0


@pytest.mark.parametrize("overrides,message", [
    (dict(role_switch="remesh", remesh_schedule="decode:1x4@1,decode:4x1@2"), None),
    (dict(role_switch="remesh", remesh_schedule="decode:1x8@1"),
     "scheduler.remesh_schedule entry 'decode:1x8' needs 8 devices; the decode tier has 4"),
    (dict(remesh_schedule="decode:1x4@1"),
     "scheduler.remesh_schedule='decode:1x4@1' needs scheduler.role_switch='remesh'"),
    (dict(role_switch="remesh", remesh_drain="wait"),
     "scheduler.remesh_drain='wait' is not one of ['migrate', 'finish']"),
    (dict(role_switch="remesh", launcher="ray", remesh_schedule="decode:1x4@1,decode:4x1@2"),
     None),
], ids=["fits", "too_many_devices", "without_remesh", "drain", "ray"])
def test_remesh_config_errors_are_one_line(overrides, message):
  from pdjax import config as config_lib
  from pdjax import config_remesh
  from pdjax.configs.default import get_config
  cfg = get_config()
  cfg.mode = "disaggregated"   # prefill 2 x TP2, decode 2 x TP2: 4 devices each
  if overrides.pop("launcher", None):
    cfg.cluster.launcher = "ray"
  for key, value in overrides.items():
    cfg.scheduler[key] = value
  if message is None:
    config_lib.validate(cfg, device_count=8)
    assert config_remesh.remesh_layouts(cfg, config_lib.model_config(cfg))["decode"] == [(1, 4),
                                                                                       (4, 1)]
    return
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg, device_count=8)
  assert str(e.value) == message


class _Cost:
  """Hand-set step costs: prefill `per_token` s per prompt token, decode `per_seq` s per
  sequence plus `per_ctx` s per context token."""

  def __init__(self, per_token=0.0, per_seq=0.0, per_ctx=0.0):
    self.per_token, self.per_seq, self.per_ctx = per_token, per_seq, per_ctx

  def prefill_s(self, chunks):
    return sum(q for q, _ in chunks) * self.per_token

  def decode_s(self, contexts):
    return len(contexts) * self.per_seq + sum(contexts) * self.per_ctx


class _Worker:
  def __init__(self, tp, waiting=(), running=(), max_batch=4):
    self.tp, self.max_batch = tp, max_batch
    self.waiting, self.running = list(waiting), list(running)


def test_costed_prefill_layout_switches_only_when_it_pays_for_the_switch():
  from pdjax.scheduler.policies.remesh_costs import prefill_layout
  costs = {1: _Cost(per_token=1e-4), 2: _Cost(per_token=0.3e-4)}
  cost_of = lambda role, tp: costs[tp]
  tier = [_Worker(1, [_req(0, 4000, 1)]), _Worker(1, [_req(1, 4000, 1)])]
  layouts = [(2, 1), (1, 2)]
  # now: (0.4 + 0.4) / 2 = 0.40 s; merged: 0.12 + 0.12 = 0.24 s, + the switch
  assert prefill_layout(tier, layouts, cost_of, switch_s=0.05) == (
      1, 2, "2 queued prompts drain in 0.29 s (switch included) instead of 0.40 s")
  assert prefill_layout(tier, layouts, cost_of, switch_s=0.1) is None   # 0.34 >= 0.8 x 0.40
  assert prefill_layout([_Worker(1), _Worker(1)], layouts, cost_of, switch_s=0.0) is None


def test_costed_decode_layout_serves_the_sequences_within_the_tpot_slo():
  from pdjax.scheduler.policies.remesh_costs import decode_layout
  costs = {1: _Cost(per_seq=1e-3, per_ctx=1e-6), 2: _Cost(per_seq=1e-3 / 3, per_ctx=1e-6 / 3)}
  cost_of = lambda role, tp: costs[tp]
  tier = [_Worker(1, running=[_req(i, 1000, 8), _req(i + 1, 1000, 8)]) for i in (0, 2)]
  for w in tier:
    for r in w.running:
      r.output_ids = [5]      # context 1001 each
  layouts = [(2, 1), (1, 2)]
  # now: each instance 2 x (1 ms + 1.001 ms) = 4.0 ms > 0.9 x 4 ms; merged: 4 sequences in
  # one TP2 instance, a third of 8.0 ms = 2.7 ms, and they fit its 4 slots
  assert decode_layout(tier, layouts, cost_of, slo_tpot_s=0.004, backlog=0) == (
      1, 2, "4 sequences: predicted step 2.7 ms in 1x2, 4.0 ms now")
  assert decode_layout(tier, layouts, cost_of, slo_tpot_s=0.004, backlog=1) is None   # 5 > 4
  assert decode_layout(tier, layouts, cost_of, slo_tpot_s=0.01, backlog=0) is None    # served



def test_costed_decode_layout_counts_the_waiting_at_their_contexts_and_pays_for_the_switch():
  from pdjax.scheduler.policies.remesh_costs import decode_layout
  costs = {1: _Cost(per_seq=1e-3, per_ctx=1e-6), 2: _Cost(per_seq=0.6e-3, per_ctx=0.6e-6)}
  cost_of = lambda role, tp: costs[tp]
  layouts = [(2, 1), (1, 2)]
  tier = [_Worker(2, running=[_req(i, 1000, 8) for i in range(4)], max_batch=4)]
  for r in tier[0].running:
    r.output_ids = [5]      # context 1001 each; the merged instance's 4 slots are full
  # 4 short prompts wait for a slot (contexts 11): two TP1 instances hold all 8, each step
  # 4 x 1 ms + 2 x 1001 + 2 x 11 us = 6.0 ms <= 0.9 x 8 ms; at the running mean context
  # (1001) they would not (8.0 ms)
  assert decode_layout(tier, layouts, cost_of, slo_tpot_s=0.008, backlog=[11] * 4) == (
      2, 1, "8 sequences: predicted step 6.0 ms in 2x1, 7.2 ms now")
  assert decode_layout(tier, layouts, cost_of, slo_tpot_s=0.008, backlog=4) is None
  # 12 waiting: none serves all 16. Now the 4 running (its slots) in a 4.8 ms step, 833
  # sequences per s; 2x1 takes 8 (4 per instance: 2 long, 2 short) in 6.0 ms, 1329 per s:
  # 1329 x (5 - 0.1) > 833 x 5
  backlog = [11] * 12
  assert decode_layout(tier, layouts, cost_of, slo_tpot_s=0.008, backlog=backlog) is None
  found = decode_layout(tier, layouts, cost_of, slo_tpot_s=0.008, backlog=backlog,
                        switch_s=0.1, horizon_s=5.0)
  assert found is not None and found[:2] == (2, 1)
  # a switch as long as the horizon never pays
  assert decode_layout(tier, layouts, cost_of, slo_tpot_s=0.008, backlog=backlog,
                       switch_s=5.0, horizon_s=5.0) is None

def test_a_remesh_of_a_tier_with_a_dead_instance_is_called_off():
  from pdjax.faults.injector import FaultInjector
  from pdjax.faults.spec import FaultSpec
  driver, builder, _ = _driver("decode:1x2@0.25")
  driver.injector = FaultInjector(FaultSpec(kills=(("decode-1", 0.1),)))
  driver._schedule(0.1, "kill", "decode-1")
  reqs = [_req(i, 4, 8, arrival=0.05 * i) for i in range(8)]
  result = driver.run(reqs)
  _check_done(result, reqs)
  ev, = result.remesh_events
  assert (ev["ok"], ev["error"]) == (False, "the decode tier has dead instances: decode-1")
  assert builder.built == []
