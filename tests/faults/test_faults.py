"""Faults on the fast path (simulated instances, virtual clock, the real driver): every fault
kind and recovery with exact outcomes, the invariants as the oracle (serve() checks them at
the end; debug=True after every loop turn)."""

import dataclasses

import pytest

from pdjax.runner import serve_requests as serving
from pdjax.engine.options import EngineOptions
from pdjax.faults.injector import FaultInjector
from pdjax.faults.spec import FaultSpec
from pdjax.models.llama_config import PRESETS
from pdjax.request import Request, SamplingParams, Status
from pdjax.scheduler.clock import ManualClock
from pdjax.sim.instance import build_sim_instances, sim_transfer

DISAGG = [("prefill", 1, 1), ("decode", 2, 1)]


def _requests(n=6, prompt=40, new=20, gap=0.001, vocab_max=300):
  return [Request(id=f"r{i}", arrival_s=gap * i,
                  prompt_ids=[5 + (7 * i + j) % vocab_max for j in range(prompt)],
                  sampling=SamplingParams(max_new_tokens=new)) for i in range(n)]


def _serve(spec=FaultSpec(), tiers=DISAGG, requests=None, mode="disaggregated", **overrides):
  clock = ManualClock()
  opts = EngineOptions(page_size=16, num_pages=64, max_model_len=512, prefill_buckets=(512,),
                       max_prefill_seqs=4, decode_buckets=(16,))
  insts = build_sim_instances(tiers, PRESETS["tiny"], opts, hardware="a100", clock=clock)
  reqs = requests if requests is not None else _requests()
  result = serving.serve(mode, insts, reqs, clock=clock, transfer_fn=sim_transfer,
                         injector=FaultInjector(spec), debug=True, vocab_size=512, **overrides)
  assert serving.kv_pages_leaked(insts) == 0
  return result


def _outcome(result):
  return [(r.status.value, r.reason, r.output_ids, r.fallbacks) for r in result.requests]


BASE = _serve()


def test_unfaulted_baseline():
  assert all(r.status == Status.FINISHED and len(r.output_ids) == 20 for r in BASE.requests)
  assert BASE.faults["injected"] == {}


def test_failed_transfers_are_retried_and_recover_with_the_same_tokens():
  """p = 0.5 per attempt; the expected retries, recoveries and fallbacks come from the
  injector's own seeded draws (4 attempts at most: the first and 3 retries)."""
  spec = FaultSpec(transfer_fail_prob=0.5, seed=3)
  result = _serve(spec)
  probe = FaultInjector(spec)
  failures = []
  for r in result.requests:
    attempt = 0
    while attempt < 4 and probe.transfer_attempt(r, attempt)[0]:
      attempt += 1
    failures.append(attempt)
  assert result.faults["transfer_retries"] == sum(min(f, 3) for f in failures) > 0
  assert result.faults["transfers_recovered"] == sum(0 < f < 4 for f in failures) > 0
  assert [r.fallbacks != [] for r in result.requests] == [f == 4 for f in failures]
  assert sum(not t["ok"] for t in result.transfers) == sum(failures)
  assert [r.output_ids for r in result.requests] == [r.output_ids for r in BASE.requests]


def test_exhausted_retries_recompute_on_the_decode_tier():
  result = _serve(FaultSpec(transfer_fail_prob=1.0), transfer_retries=2)
  assert all(r.status == Status.FINISHED for r in result.requests)
  assert all(r.fallbacks == ["transfer_failed:recompute_on_decode"] for r in result.requests)
  assert [r.output_ids for r in result.requests] == [r.output_ids for r in BASE.requests]
  assert result.faults["transfer_retries"] == 2 * 6
  assert len(result.transfers) == 3 * 6 and not any(t["ok"] for t in result.transfers)
  assert all(r.decode_instance in ("decode-0", "decode-1") for r in result.requests)


def test_exhausted_retries_fail_under_the_fail_policy():
  result = _serve(FaultSpec(transfer_fail_prob=1.0), transfer_retries=1,
                  transfer_failure_policy="fail")
  # Nothing decodes anywhere: the decode tier is always tied, so least_loaded's attempts
  # rotate over decode-0 and decode-1 (the reason names the last one).
  assert {(r.status.value, r.reason) for r in result.requests} == {
      ("failed", f"kv transfer failed after 2 attempt(s): prefill-0->decode-{i}: injected "
                 "transfer failure") for i in (0, 1)}


def test_a_stalled_transfer_times_out_and_is_retried():
  result = _serve(FaultSpec(transfer_delay=("const", 0.5)), transfer_timeout_s=0.05,
                  transfer_retries=1)
  assert all(r.fallbacks == ["transfer_failed:recompute_on_decode"] for r in result.requests)
  assert result.faults["injected"]["transfer_delay"] == 12
  # Each attempt waited out the timeout, not the whole stall.
  assert all(t["seconds"] == pytest.approx(0.05, abs=1e-3) for t in result.transfers)


def test_a_short_delay_only_slows_the_transfer():
  result = _serve(FaultSpec(transfer_delay=("const", 0.002)), transfer_timeout_s=0.05)
  assert [r.output_ids for r in result.requests] == [r.output_ids for r in BASE.requests]
  assert all(not r.fallbacks for r in result.requests)
  slower = [a.transfer_end_s - a.transfer_start_s - (b.transfer_end_s - b.transfer_start_s)
            for a, b in zip(result.requests, BASE.requests)]
  assert all(d == pytest.approx(0.002, abs=1e-9) for d in slower)


def test_a_slow_instance_takes_factor_times_longer():
  result = _serve(FaultSpec(slow_instances=(("prefill-0", 4.0, 0.0),)))
  spans = [s["end_s"] - s["start_s"] for s in result.steps if s["instance"] == "prefill-0"]
  base = [s["end_s"] - s["start_s"] for s in BASE.steps if s["instance"] == "prefill-0"]
  assert len(spans) == len(base) and spans[0] == pytest.approx(4 * base[0])
  assert result.faults["injected"]["slow_step"] == len(spans)


def _mid_decode_time():
  """Halfway through the first request decode-0 decodes in the unfaulted run."""
  r = next(r for r in BASE.requests if r.decode_instance == "decode-0")
  return (r.decode_start_s + r.finish_s) / 2


def test_a_killed_decode_instance_recomputes_its_requests_elsewhere():
  t = _mid_decode_time()
  result = _serve(FaultSpec(kills=(("decode-0", t),)))
  moved = [r for r in result.requests if r.fallbacks]
  assert moved and all(r.fallbacks == ["instance_died:recomputed"] for r in moved)
  assert all(r.status == Status.FINISHED for r in result.requests)
  assert [r.output_ids for r in result.requests] == [r.output_ids for r in BASE.requests]
  assert {r.decode_instance for r in moved} == {"decode-1"}
  assert result.faults["instances_killed"] == 1 and result.faults["pages_lost_with_instances"] > 0
  late = [r for r in result.requests if r.decode_start_s and r.decode_start_s > t]
  assert all(r.decode_instance == "decode-1" for r in late)   # never routed to the dead one


def test_without_a_live_instance_left_requests_fail_with_the_reason():
  t = _mid_decode_time()
  result = _serve(FaultSpec(kills=(("decode-0", t), ("decode-1", t))), lease_s=1.0)
  # Both die at t, decode-0 first: its requests move to decode-1, which then dies with no
  # decode instance left. A request whose prefill ended after t waits in the transfer queue
  # until its lease expires; _reclaim_leases counts its prefill-side block table: its prompt's
  # pages, ceil(40 / 16) = 3 each.
  died = "decode-1 died and no live instance is left in the decode tier"
  lease = "KV lease of 1 s expired on prefill-0: no decode instance pulled it"
  reclaimed = [r for r in result.requests if r.prefill_end_s > t]
  assert 0 < len(reclaimed) < len(result.requests)
  assert [(r.id, r.status.value, r.reason) for r in result.requests] == [
      (r.id, "failed", lease if r.prefill_end_s > t else died) for r in result.requests]
  page_size = 16
  assert result.faults["pages_reclaimed_by_lease"] == sum(
      -(-r.prompt_len // page_size) for r in reclaimed) == 3 * len(reclaimed)


def test_lease_reclaims_prefill_kv_nobody_pulls():
  result = _serve(FaultSpec(kills=(("decode-0", 0.0), ("decode-1", 0.0))), lease_s=0.5)
  assert {(r.status.value, r.reason) for r in result.requests} == {
      ("failed", "KV lease of 0.5 s expired on prefill-0: no decode instance pulled it")}
  assert result.faults["pages_reclaimed_by_lease"] == 6 * 3   # 40 tokens: 3 pages each


def test_a_restarted_instance_takes_work_again():
  reqs = _requests(n=12, gap=0.05)
  result = _serve(FaultSpec(kills=(("decode-0", 0.0),), restart_s=0.2), requests=reqs)
  before = {r.decode_instance for r in result.requests if r.decode_start_s < 0.2}
  after = {r.decode_instance for r in result.requests if r.decode_start_s > 0.25}
  assert before == {"decode-1"} and "decode-0" in after
  assert result.faults["instances_restarted"] == 1


def test_a_killed_prefill_instance_reroutes_its_queue():
  tiers = [("prefill", 2, 1), ("decode", 1, 1)]
  reqs = _requests(n=8, gap=0.0)
  base = _serve(tiers=tiers, requests=_requests(n=8, gap=0.0))
  result = _serve(FaultSpec(kills=(("prefill-1", 1e-6),)), tiers=tiers, requests=reqs)
  assert all(r.status == Status.FINISHED for r in result.requests)
  assert {r.prefill_instance for r in base.requests} == {"prefill-0", "prefill-1"}
  rerouted = [r for r in result.requests if r.fallbacks]
  assert rerouted and all(r.fallbacks == ["instance_died:rerouted"] for r in rerouted)
  assert [r.output_ids for r in result.requests] == [r.output_ids for r in base.requests]


@pytest.mark.parametrize("mode,tiers,stage", [
    ("disaggregated", DISAGG, "queued"), ("disaggregated", DISAGG, "prefill"),
    ("disaggregated", DISAGG, "transfer_wait"), ("disaggregated", DISAGG, "transfer"),
    ("disaggregated", DISAGG, "decode"), ("colocated", [("colocated", 2, 1)], "queued"),
    ("colocated", [("colocated", 2, 1)], "prefill"), ("colocated", [("colocated", 2, 1)], "decode"),
])
def test_cancellation_at_every_stage_frees_everything(mode, tiers, stage):
  result = _serve(FaultSpec(cancel_prob=1.0, cancel_stages=(stage,), seed=1), tiers=tiers,
                  mode=mode)
  assert {(r.status.value, r.reason) for r in result.requests} == {
      ("cancelled", f"cancelled by the client ({stage})")}
  tokens = [len(r.output_ids) for r in result.requests]
  if stage in ("queued", "prefill"):
    assert tokens == [0] * 6
  elif stage in ("transfer_wait", "transfer"):
    assert tokens == [1] * 6
  else:
    probe = FaultInjector(FaultSpec(cancel_prob=1.0, cancel_stages=(stage,), seed=1))
    assert tokens == [probe.cancel_plan(r)[1] for r in result.requests]
  assert result.faults["injected"] == {"cancel": 6}


def test_driver_cancel_api_ends_a_request_mid_decode():
  reqs = _requests(n=2)
  clock = ManualClock()
  opts = EngineOptions(page_size=16, num_pages=64, max_model_len=512, prefill_buckets=(512,),
                       max_prefill_seqs=4, decode_buckets=(16,))
  insts = build_sim_instances(DISAGG, PRESETS["tiny"], opts, hardware="a100", clock=clock)
  from pdjax.scheduler.driver import Driver
  from pdjax.scheduler.instance_queue import InstanceQueue
  workers = [InstanceQueue(i, i.role, 16) for i in insts]
  driver = Driver("disaggregated", workers, clock=clock, transfer_fn=sim_transfer,
                  options=dataclasses.replace(serving.driver_options(opts, 16), debug=True))
  original = driver._emit

  def emit_then_cancel(w, req, token, now):
    done = original(w, req, token, now)
    if req.id == "r0" and len(req.output_ids) == 5:
      driver.cancel(req)
    return done

  driver._emit = emit_then_cancel
  a, b = driver.run(reqs).requests
  assert (a.status.value, a.reason, len(a.output_ids)) == (
      "cancelled", "cancelled by the client (client)", 5)
  assert b.status == Status.FINISHED and len(b.output_ids) == 20
  assert sum(i.tables.num_used_pages for i in insts) == 0


def test_bad_prompts_are_rejected_with_the_reason_and_the_rest_complete():
  good = _requests(n=2)
  bad = [Request(id="oov", arrival_s=0.0, prompt_ids=[5, 512, 7]),
         Request(id="neg", arrival_s=0.0, prompt_ids=[5, -3]),
         Request(id="empty", arrival_s=0.0, prompt_ids=[]),
         Request(id="zero", arrival_s=0.0, prompt_ids=[5],
                 sampling=SamplingParams(max_new_tokens=0)),
         Request(id="long", arrival_s=0.0, prompt_ids=[5] * 600)]
  result = _serve(requests=good + bad)
  assert [(r.id, r.status.value, r.reason) for r in result.requests[2:]] == [
      ("oov", "rejected", "prompt token id 512 is outside the vocabulary [0, 512)"),
      ("neg", "rejected", "prompt token id -3 is outside the vocabulary [0, 512)"),
      ("empty", "rejected", "empty prompt"),
      ("zero", "rejected", "max_new_tokens=0 must be >= 1"),
      ("long", "rejected", "prompt_len + max_new_tokens = 616 exceeds max_model_len = 512")]
  assert all(r.status == Status.FINISHED for r in result.requests[:2])


NAMES = {"disaggregated": ["prefill-0", "prefill-1", "decode-0", "decode-1"],
         "colocated": ["colocated-0", "colocated-1", "colocated-2"]}
TIERS = {"disaggregated": [("prefill", 2, 1), ("decode", 2, 1)],
         "colocated": [("colocated", 3, 1)]}
FAULT_FREE = {mode: _serve(tiers=TIERS[mode], requests=_requests(n=10, new=12), mode=mode)
              for mode in TIERS}


from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402
from pdjax.faults.spec import CANCEL_STAGES  # noqa: E402


@st.composite
def fault_schedules(draw):
  mode = draw(st.sampled_from(sorted(TIERS)))
  kills = draw(st.lists(st.tuples(st.sampled_from(NAMES[mode]),
                                  st.floats(0.0, 0.03, allow_nan=False)),
                        max_size=3, unique_by=lambda k: k[0]))
  delay = draw(st.sampled_from([(), ("const", 0.001), ("exp", 0.002), ("uniform", 0.0, 0.01)]))
  spec = FaultSpec(transfer_fail_prob=draw(st.sampled_from([0.0, 0.3, 1.0])),
                   transfer_delay=delay,
                   slow_instances=tuple((n, 3.0, 0.005) for n in
                                        draw(st.lists(st.sampled_from(NAMES[mode]),
                                                      max_size=1))),
                   kills=tuple(sorted(kills, key=lambda k: k[1])),
                   restart_s=draw(st.sampled_from([0.0, 0.01])),
                   cancel_prob=draw(st.sampled_from([0.0, 0.3])),
                   cancel_stages=tuple(draw(st.lists(st.sampled_from(CANCEL_STAGES),
                                                     min_size=1, unique=True))),
                   seed=draw(st.integers(0, 3)))
  overrides = dict(transfer_retries=draw(st.integers(0, 2)),
                   transfer_failure_policy=draw(st.sampled_from(["retry_then_recompute",
                                                                 "fail"])),
                   transfer_timeout_s=draw(st.sampled_from([0.0, 0.005])),
                   lease_s=draw(st.sampled_from([0.0, 0.02])))
  return mode, spec, overrides


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fault_schedules())
def test_random_fault_schedules_lose_nothing(schedule):
  """Whatever goes wrong: serve() returns (its end-state check passed: all terminal, every
  page free, bookkeeping intact; debug=True checked it after every loop turn too), every
  finished request has exactly the tokens of the fault-free run, and the summary's counts
  agree with the requests."""
  mode, spec, overrides = schedule
  result = _serve(spec, tiers=TIERS[mode], requests=_requests(n=10, new=12), mode=mode,
                  **overrides)
  for r, base in zip(result.requests, FAULT_FREE[mode].requests):
    assert r.status.terminal
    if r.status == Status.FINISHED:
      assert r.output_ids == base.output_ids
    else:
      assert r.reason
  from pdjax.metrics.faults import fault_summary
  summary = fault_summary(result.requests, result.faults)
  assert summary["cancelled"] == sum(r.status == Status.CANCELLED for r in result.requests)
  assert summary["cancelled"] <= result.faults["injected"].get("cancel", 0)
  assert sum(summary["failed"].values()) == sum(r.status == Status.FAILED
                                                for r in result.requests)


def test_report_says_it_in_words_when_more_than_1_percent_fell_back():
  from pdjax.metrics.report_sections import faults_section
  f = {"injected": {"transfer_fail": 9}, "transfer_retries": 6, "transfers_recovered": 2,
       "fell_back": {"transfer_failed:recompute_on_decode": 3}, "fell_back_requests": 3,
       "failed": {}, "cancelled": 0, "cancelled_by_stage": {}}
  assert faults_section(f, 100) == [
      "## Faults and recovery", "",
      "- Injected: transfer_fail 9",
      "- KV transfer attempts retried: 6; transfers that succeeded after failing: 2",
      "- Requests that fell back: 3 (transfer_failed:recompute_on_decode 3)", "",
      "**3.0% of requests did not take their planned path** (more than 1%): latency numbers "
      "of this run include recoveries, not the steady state of the configuration.", ""]
  assert faults_section(f, 1000)[-1] == ""             # 0.3%: listed, not called out
  assert not any("did not take" in line for line in faults_section(f, 1000))
  assert faults_section({"injected": {}, "fell_back_requests": 0}, 10) == []


def test_cli_sim_run_with_every_fault_on(tmp_path):
  """The sim backend through the CLI, every fault kind on: nothing lost, the summary's faults
  object and report section, fallbacks per request."""
  import json
  import subprocess
  import sys
  proc = subprocess.run(
      [sys.executable, "-m", "pdjax.run", "--config=configs/default.py", "--config.backend=sim",
       "--config.progress=False", "--config.mode=disaggregated", "--config.debug=True",
       "--config.repeats=1",
       "--config.workload.num_requests=300", "--config.workload.rate=200",
       "--config.faults.transfer_fail_prob=0.3", "--config.faults.transfer_delay=exp:0.002",
       "--config.kv.transfer_timeout_s=0.005", "--config.faults.slow_instance=decode-1:3@0.2",
       "--config.faults.kill_instance=decode-0@0.5,prefill-1@0.7",
       "--config.faults.restart_s=0.3", "--config.faults.cancel_prob=0.1",
       f"--workdir={tmp_path}"], capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  s = json.loads((tmp_path / "summary.json").read_text())
  records = [json.loads(l) for l in (tmp_path / "requests.jsonl").open()]
  f = s["faults"]
  assert set(f["injected"]) == {"cancel", "kill_instance", "slow_step", "transfer_delay",
                                "transfer_fail"}
  assert f["instances_killed"] == 2 and f["instances_restarted"] == 2
  assert sum(s["requests"][k] for k in ("finished", "rejected", "failed", "cancelled")) == 300
  assert f["fell_back_requests"] == sum(1 for r in records if r["fallbacks"])
  assert s["kv_pages_leaked"] == 0
  assert "## Faults and recovery" in (tmp_path / "report.md").read_text()


def test_a_request_finished_twice_fails_the_run_loudly():
  from pdjax.scheduler import driver as driver_lib
  original = driver_lib.Driver._emit

  def emit_twice(self, w, req, token, now):
    done = original(self, w, req, token, now)
    if done and req.id == "r0":
      self._terminal += 1            # as if a second path had finished it again
    return done

  driver_lib.Driver._emit = emit_twice
  try:
    with pytest.raises(AssertionError, match="the driver ended 7 requests, 6 are terminal"):
      _serve()
  finally:
    driver_lib.Driver._emit = original
