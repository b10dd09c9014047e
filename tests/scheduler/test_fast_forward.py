"""The simulator's decode fast-forward (pdjax/scheduler/fast_forward.py) changes nothing but
speed: on several configurations, every output file of a run with it (sim.fast_forward=True,
the default) equals the run stepping one loop turn per step, byte for byte, and so do the raw
step records and samples. Each configuration must actually fast-forward steps, or the
comparison would prove nothing."""

import filecmp
import json
import os

import pytest

from helpers import sim_snapshots

CASES = {
    # colocated, chunked and disaggregated on the mixed workload, 4+4 instances
    "compare": {"mode": "compare", "workload.num_requests": 60, "workload.rate": 30.0},
    # pools too small for the batch: decode steps preempt (recompute) inside the chains
    "preempt": {"mode": "compare", "workload.num_requests": 40, "workload.rate": 60.0,
                "kv.pages_per_instance": 40, "workload.preset": "long_doc_qa"},
    # prefix cache on multi-turn sessions, KV-aware routers, transfer faults and delays
    "prefix_faults": dict(sim_snapshots.CONFIGS["prefix_faults"]),
    # a killed and restarted instance, a slow one, client cancels in every stage, leases
    "kill_slow_cancel": {"mode": "compare", "workload.num_requests": 60, "workload.rate": 30.0,
                         "faults.kill_instance": "decode-1@0.4,colocated-2@0.5",
                         "faults.restart_s": 0.3,
                         "faults.slow_instance": "decode-0:3@0.2,colocated-1:2@0.1",
                         "faults.cancel_prob": 0.2, "kv.lease_s": 0.5},
    # the host KV tier shared by the instances (offloads from chained steps' evictions)
    "host_tier": {"mode": "compare", "workload.preset": "agent_multiturn",
                  "workload.num_requests": 60, "workload.rate": 40.0, "kv.prefix_cache": True,
                  "kv.pages_per_instance": 48, "kv.host_tier_pages": 256,
                  "scheduler.prefill_router": "kv_aware_prefix"},
    # decode segments (scheduler/decode_segments.py) at their limits: long outputs, batches of
    # up to ~35 rows (the digest chain in numpy), and disaggregated decode pools too small
    # for their batches (preemptions: segments bounded by when a chain could preempt)
    "chain_heavy": {"mode": "compare", "workload.preset": "lognormal",
                    "workload.lognormal_output_mean": 200.0,
                    "workload.lognormal_max_output_len": 400,
                    "workload.lognormal_prompt_mean": 64.0,
                    "workload.lognormal_max_prompt_len": 128, "workload.num_requests": 120,
                    "workload.rate": 3000.0, "scheduler.decode_buckets": [4, 16, 32, 64],
                    "kv.pages_per_instance": 240},
    # a 64-instance cluster on h100 shapes (16 prefill + 48 decode, TP1)
    "wide": {"mode": "disaggregated", "workload.num_requests": 300, "workload.rate": 200.0,
             "cluster.prefill.instances": 16, "cluster.prefill.tp": 1,
             "cluster.decode.instances": 48, "cluster.decode.tp": 1, "sim.hardware": "h100",
             "num_cpu_devices": 64},
}


def _run(tmp_path, overrides: dict, fast_forward: bool):
  from pdjax import config as config_lib
  from pdjax.runner.execute import execute
  from pdjax.runner.outputs import write_outputs
  cfg = sim_snapshots._config({**overrides, "sim.fast_forward": fast_forward})
  mcfg = config_lib.validate(cfg)
  out, counts = {}, {}
  for run in config_lib.modes(cfg):
    summary, result, _ = execute(cfg, mcfg, run, None, quiet=True)
    folder = tmp_path / f"ff{int(fast_forward)}" / run
    write_outputs(str(folder), cfg, run, summary, result)
    out[run] = (folder, json.dumps([list(result.steps), list(result.samples)], sort_keys=True))
    counts[run] = (result.fast_forwarded, result.segment_steps, result.preemptions)
  return out, counts


# the fast tier keeps the three-mode case; CI runs every case
@pytest.mark.parametrize("name", [n if n == "compare" else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(CASES)])
def test_fast_forward_outputs_equal_stepping_one_by_one(tmp_path, name):
  stepped, none = _run(tmp_path, CASES[name], fast_forward=False)
  forwarded, counts = _run(tmp_path, CASES[name], fast_forward=True)
  assert {c[:2] for c in none.values()} == {(0, 0)}
  for run, (folder, records) in stepped.items():
    assert counts[run][0] > 0, f"{name}/{run}: no step was fast-forwarded"
    if name == "chain_heavy":   # most steps in segments; the full pools preempt
      assert counts[run][1] > counts[run][0] / 3, f"{run}: {counts[run]}"
      assert (counts[run][2] > 0) == (run == "disaggregated"), f"{run}: {counts[run]}"
    elif name == "host_tier":   # (segments are off with a host tier)
      assert counts[run][1] == 0, f"{run}: {counts[run]}"
    other, other_records = forwarded[run]
    for file in ("requests.jsonl", "summary.json", "report.md", "trace.json"):
      assert filecmp.cmp(folder / file, other / file, shallow=False), f"{name}/{run}/{file}"
    assert records == other_records, f"{name}/{run}: step records or samples differ"


def test_role_switching_runs_step_by_step():
  """queue_balance is asked every loop turn: a run with it never fast-forwards."""
  from pdjax import config as config_lib
  from pdjax.runner.execute import execute
  cfg = sim_snapshots._config(sim_snapshots.CONFIGS["role_switch"])
  _, result, _ = execute(cfg, config_lib.validate(cfg), "disaggregated", None, quiet=True)
  assert result.role_switches and result.fast_forwarded == 0
