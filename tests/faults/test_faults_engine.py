"""One real-engine run per fault kind (tiny Llama, float32, greedy, CPU devices): whatever
fails, every finished request's tokens equal the no-cache reference, every other request
ends with a reason, and every page returns to its pool (serve() checks that loudly)."""

import dataclasses

import jax
import numpy as np
import pytest

from conftest import tiny_engine_options
from pdjax.engine import programs
from pdjax.engine.cluster import build_instances
from pdjax.engine.transfer import transfer_kv_async
from pdjax.faults.injector import FaultInjector
from pdjax.faults.spec import FaultSpec
from pdjax.request import Request, SamplingParams, Status
from pdjax.runner import serve_requests as serving
from pdjax.scheduler.clock import WallClock
from pdjax.scheduler.driver import Driver
from pdjax.scheduler.instance_queue import InstanceQueue

pytestmark = pytest.mark.slow
TIERS = [("prefill", 1, 1), ("decode", 2, 1)]
MAX_NEW = [12, 9, 14, 10, 16, 11]


def _prompts():
  return [[(5 * i + 3 * j) % 400 + 3 for j in range(n)]
          for i, n in enumerate([9, 17, 5, 24, 12, 30])]


def _requests(**kw):
  return [Request(id=f"r{i}", arrival_s=0.01 * i, prompt_ids=p, eos_ids=(2,),
                  sampling=SamplingParams(max_new_tokens=m, **kw))
          for i, (p, m) in enumerate(zip(_prompts(), MAX_NEW))]


@pytest.fixture(scope="module")
def cluster(tiny_model):
  cfg, params = tiny_model
  reference = [programs.reference_generate(params, cfg, p, m, eos_ids=(2,))
               for p, m in zip(_prompts(), MAX_NEW)]
  return build_instances(TIERS, cfg, params, tiny_engine_options()), reference


def _check(result, reference):
  for r, ref in zip(result.requests, reference):
    if r.status == Status.FINISHED:
      assert r.output_ids == ref, r.id
    else:
      assert r.reason, r.id


def test_failed_transfers_recompute_on_decode_with_identical_tokens(cluster):
  instances, reference = cluster
  result = serving.serve("disaggregated", instances, _requests(), debug=True,
                         injector=FaultInjector(FaultSpec(transfer_fail_prob=1.0)),
                         transfer_retries=1)
  assert [r.status for r in result.requests] == [Status.FINISHED] * 6
  assert all(r.fallbacks == ["transfer_failed:recompute_on_decode"] for r in result.requests)
  _check(result, reference)


def test_a_decode_instance_killed_mid_decode(cluster):
  """decode-0 dies after its first request's 4th token: its requests are recomputed on
  decode-1 and still produce the reference tokens."""
  instances, reference = cluster
  opts = instances[0].opts
  workers = [InstanceQueue(i, i.role, max(opts.decode_buckets)) for i in instances]
  driver = Driver("disaggregated", workers, clock=WallClock(), transfer_fn=transfer_kv_async,
                  options=dataclasses.replace(serving.driver_options(opts, 8), debug=True))
  emit = driver._emit

  def emit_and_kill(w, req, token, now):
    done = emit(w, req, token, now)
    if w.name == "decode-0" and len(req.output_ids) == 4 and not w.dead:
      driver._kill(w)
    return done

  driver._emit = emit_and_kill
  result = driver.run(_requests())
  serving.check_end_state(result, instances)
  moved = [r for r in result.requests if "instance_died:recomputed" in r.fallbacks]
  assert moved and all(r.decode_instance == "decode-1" for r in moved)
  assert [r.status for r in result.requests] == [Status.FINISHED] * 6
  _check(result, reference)


@pytest.mark.parametrize("stage", ["queued", "prefill", "transfer_wait", "transfer", "decode"])
def test_cancellation_on_the_real_engine(cluster, stage):
  instances, reference = cluster
  result = serving.serve("disaggregated", instances, _requests(), debug=True,
                         injector=FaultInjector(FaultSpec(cancel_prob=0.5, seed=2,
                                                          cancel_stages=(stage,))))
  cancelled = [r for r in result.requests if r.status == Status.CANCELLED]
  assert cancelled and {r.reason for r in cancelled} == {f"cancelled by the client ({stage})"}
  _check(result, reference)
  # The pools are clean: an unfaulted run afterwards still gives the reference tokens.
  again = serving.serve("disaggregated", instances, _requests())
  assert [r.output_ids for r in again.requests] == reference


def test_slow_instance_and_delayed_transfers_change_timing_not_tokens(cluster):
  """decode-1 is 3x slow from t=0 and every transfer attempt is held 0.01 s: the tokens are
  the reference, every transfer took at least the delay (start to landing), every step on
  decode-1 (and only there) was slowed, and its decode steps took clearly longer than
  decode-0's (same programs, same devices' kind: medians, with a margin for a noisy host)."""
  instances, reference = cluster
  spec = FaultSpec(slow_instances=(("decode-1", 3.0, 0.0),), transfer_delay=("const", 0.01))
  result = serving.serve("disaggregated", instances, _requests(), injector=FaultInjector(spec))
  assert [r.output_ids for r in result.requests] == reference
  assert result.faults["injected"]["transfer_delay"] == 6
  assert [t["ok"] for t in result.transfers] == [True] * 6
  assert all(r.transfer_end_s - r.transfer_start_s >= 0.01 for r in result.requests)
  counts = result.step_counts()
  assert set(counts["decode-1"]) == {"decode"} and counts["decode-0"]["decode"] > 0
  assert result.faults["injected"]["slow_step"] == counts["decode-1"]["decode"]

  def median_decode_s(name):
    return float(np.median([s["end_s"] - s["start_s"] for s in result.steps
                            if s["instance"] == name and s["kind"] == "decode"]))

  assert median_decode_s("decode-1") >= 2.0 * median_decode_s("decode-0")


def test_bad_prompts_next_to_good_ones(cluster):
  instances, reference = cluster
  cfg_vocab = 512
  bad = [Request(id="oov", arrival_s=0.0, prompt_ids=[5, cfg_vocab]),
         Request(id="empty", arrival_s=0.0, prompt_ids=[]),
         Request(id="zero", arrival_s=0.0, prompt_ids=[5],
                 sampling=SamplingParams(max_new_tokens=0)),
         Request(id="long", arrival_s=0.0, prompt_ids=[5] * 90)]
  result = serving.serve("disaggregated", instances, _requests() + bad, vocab_size=cfg_vocab)
  assert [r.output_ids for r in result.requests[:6]] == reference
  assert [(r.status.value, r.reason) for r in result.requests[6:]] == [
      ("rejected", "prompt token id 512 is outside the vocabulary [0, 512)"),
      ("rejected", "empty prompt"),
      ("rejected", "max_new_tokens=0 must be >= 1"),
      ("rejected", "prompt_len + max_new_tokens = 106 exceeds max_model_len = 96")]


def test_non_finite_logits_fail_the_request_with_the_reason(tiny_model):
  """A poisoned checkpoint (NaN in the final norm's weight): every request fails with the reason, the
  run itself completes and frees every page."""
  cfg, params = tiny_model
  poisoned = jax.tree_util.tree_map(np.copy, params)
  norm = poisoned["params"]["norm"]
  norm["weight"] = np.full_like(norm["weight"], np.nan)
  instances = build_instances([("colocated", 1, 1)], cfg, poisoned, tiny_engine_options())
  result = serving.serve("colocated", instances, _requests())
  assert {(r.status.value, r.reason) for r in result.requests} == {
      ("failed", "the model produced non-finite logits (NaN/inf); no token was sampled")}
  assert serving.kv_pages_leaked(instances) == 0


def test_debug_check_catches_an_output_that_differs_from_running_alone(tiny_model):
  cfg, params = tiny_model
  reqs = _requests()[:2]
  for r, m in zip(reqs, MAX_NEW):
    r.output_ids = programs.reference_generate(params, cfg, r.prompt_ids, m, eos_ids=(2,))
    r.status = Status.FINISHED
  assert serving.check_outputs_alone(reqs, cfg, params) == 2
  reqs[1].output_ids[3] += 1          # as if another request's token had leaked in
  with pytest.raises(serving.InvariantViolation,
                     match="request r1: output differs from the same request run alone from "
                           "token 3 on"):
    serving.check_outputs_alone(reqs, cfg, params)


def test_cli_debug_run_with_faults_on_the_real_engine(tmp_path):
  """python -m pdjax.run with debug=True and faults on: the run completes (every invariant
  held after every loop turn, and every greedy output equals its request run alone)."""
  import json
  import subprocess
  import sys
  proc = subprocess.run(
      [sys.executable, "-m", "pdjax.run", "--config=configs/default.py:smoke",
       "--config.progress=False", "--config.mode=disaggregated", "--config.debug=True",
       "--config.faults.transfer_fail_prob=0.5", "--config.faults.cancel_prob=0.25",
       "--config.faults.seed=1", f"--workdir={tmp_path}"],
      capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-2000:]
  summary = json.loads((tmp_path / "summary.json").read_text())
  f = summary["faults"]
  assert f["injected"]["transfer_fail"] > 0 and f["transfer_retries"] > 0
  assert summary["requests"]["cancelled"] == f["cancelled"] > 0
  assert summary["requests"]["finished"] + f["cancelled"] + summary["requests"]["failed"] == 8
  records = [json.loads(l) for l in (tmp_path / "requests.jsonl").open()]
  assert all("fallbacks" in r for r in records)


def _poison_on_free(inst):
  """From now on, every page that returns to inst's free list is filled with NaN on the device
  at once (as if its next owner had written garbage): a step that reads it after the free
  would turn outputs into NaN or change tokens. A transfer already dispatched from it is not
  disturbed (the poisoned pool is a new array; the gather holds the old one), so the order of
  a transfer's landing and its source's free is checked on the fake engine instead
  (test_driver_fake.py: test_source_pages_are_freed_only_after_the_landing_is_observed)."""
  import jax.numpy as jnp
  width = inst.opts.pages_per_seq
  poison = jax.jit(lambda kv, pages: tuple(x.at[:, :, pages].set(jnp.nan) for x in kv),
                   out_shardings=inst._kv_sh)
  free = inst.tables.free

  def free_and_poison(seq_id, now=0.0):
    pages = inst.tables.block_table(seq_id)
    free(seq_id, now)
    gone = [p for p in pages if inst.tables.allocator.is_free(p)]
    if gone:
      padded = (gone * width)[:width]
      inst.kv = poison(inst.kv, jnp.asarray(padded, jnp.int32))

  inst.tables.free = free_and_poison
  return lambda: setattr(inst.tables, "free", free)


def test_no_step_reads_a_page_after_it_is_freed(cluster):
  """Pages are poisoned the moment they return to the free list — after a transfer (the source
  side), on a failed attempt (the destination side), on cancellation and on finish — with
  transfer failures, retries and cancellations on: finished requests still match the
  reference, so no later prefill or decode step read a freed page (a stale block table, a page
  freed while another sequence or the prefix cache still held it). It cannot see a transfer
  reading a freed source page (see _poison_on_free)."""
  instances, reference = cluster
  undo = [_poison_on_free(inst) for inst in instances]
  try:
    spec = FaultSpec(transfer_fail_prob=0.5, cancel_prob=0.3, seed=4)
    result = serving.serve("disaggregated", instances, _requests(), debug=True,
                           injector=FaultInjector(spec))
  finally:
    for u in undo:
      u()
  assert sum(r.status == Status.FINISHED for r in result.requests) >= 3
  assert result.faults["transfer_retries"] > 0
  _check(result, reference)
  again = serving.serve("disaggregated", instances, _requests())   # pools full of NaN now
  assert [r.output_ids for r in again.requests] == reference
