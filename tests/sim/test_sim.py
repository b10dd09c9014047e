"""The simulated backend: roofline arithmetic, determinism, the same driver and policies, and
clusters larger than this machine."""

import json
import os
import subprocess
import sys

import pytest

from pdjax.runner import serve_requests as serving
from pdjax.engine.options import EngineOptions
from pdjax.models.llama_config import LlamaConfig, PRESETS
from pdjax.request import Request, SamplingParams, Status
from pdjax.scheduler.clock import ManualClock
from pdjax.sim.hardware import HARDWARE, Hardware
from pdjax.sim.instance import build_sim_instances, sim_transfer
from pdjax.sim.roofline import RooflineCost

# A round-number model and chip so the roofline can be checked by hand.
CFG = LlamaConfig(vocab_size=1000, hidden_size=100, intermediate_size=200, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=25)
CHIP = Hardware("test", bf16_flops=1e12, hbm_bytes=1e9, hbm_bytes_per_s=1e9,
                link_bytes_per_s=1e8)


def _cost(**kw):
  return RooflineCost(CFG, CHIP, tp=1, dtype_bytes=2, eff_flops=1.0, eff_bw=1.0,
                      step_overhead_s=0.0, link_latency_s=0.0, **kw)


def test_roofline_by_hand():
  cost = _cost()
  # attention: 100 * 25 * (2*4 + 2*2) = 30_000; mlp: 3 * 100 * 200 = 60_000; x2 layers;
  # + lm head 100 * 1000 = 100_000 -> 280_000 matmul params; weights add the embedding.
  assert cost.matmul_params == 280_000
  assert cost.weight_bytes == (280_000 + 100_000) * 2
  assert cost.kv_bytes_per_token() == 2 * 2 * 2 * 25 * 2       # k+v, layers, kv heads, D, bytes
  # Decode of 2 sequences at context 10 and 30: memory bound.
  flops = 2 * 280_000 * 2 + 4 * 2 * 4 * 25 * 40
  bytes_ = 760_000 + 400 * 40
  assert cost.decode_s([10, 30]) == pytest.approx(max(flops / 1e12, bytes_ / 1e9))
  assert cost.decode_s([10, 30]) == pytest.approx(bytes_ / 1e9)
  # Prefill of 1000 new tokens after 24 cached: weights + 1024 tokens of KV read (1.17 ms)
  # outweigh 0.98 ms of compute on this chip; at 10x the tokens compute wins.
  attn = 4 * 2 * 4 * 25 * 1000 * (24 + 1001 / 2)
  flops = 2 * 280_000 * 1000 + attn
  assert cost.prefill_s([(1000, 24)]) == pytest.approx((760_000 + 400 * 1024) / 1e9)
  assert flops / 1e12 == pytest.approx(0.0009796)
  flops_10k = 2 * 280_000 * 10_000 + 4 * 2 * 4 * 25 * 10_000 * (10_001 / 2)
  assert cost.prefill_s([(10_000, 0)]) == pytest.approx(flops_10k / 1e12)
  assert cost.transfer_s(1e6) == pytest.approx(1e6 / 1e8)
  assert _cost(link_bytes_per_s=1e9).transfer_s(1e6) == pytest.approx(1e-3)


def test_presets_cover_the_contract_names():
  assert sorted(HARDWARE) == ["a100", "b200", "h100", "h200", "mi300x", "tpu_v5e", "tpu_v5p",
                              "tpu_v6e", "tpu_v7x"]


def _serve_sim(tiers, mode, n=40, gap_s=0.01):
  clock = ManualClock()
  opts = EngineOptions(page_size=16, num_pages=256, max_model_len=512, prefill_buckets=(512,),
                       max_prefill_seqs=4, decode_buckets=(16,))
  insts = build_sim_instances(tiers, PRESETS["tiny"], opts, hardware="a100", clock=clock)
  reqs = [Request(id=f"r{i}", arrival_s=gap_s * i, prompt_ids=[5] * (20 + 13 * i % 300),
                  sampling=SamplingParams(max_new_tokens=4 + i % 9), eos_ids=(2,))
          for i in range(n)]
  result = serving.serve(mode, insts, reqs, clock=clock, transfer_fn=sim_transfer)
  return result, insts


def test_sim_runs_the_real_driver_deterministically_and_leaks_nothing():
  tiers = [("prefill", 2, 1), ("decode", 2, 1)]
  a, insts = _serve_sim(tiers, "disaggregated")
  b, _ = _serve_sim(tiers, "disaggregated")
  assert [r.to_record() for r in a.requests] == [r.to_record() for r in b.requests]
  assert all(r.status == Status.FINISHED for r in a.requests)
  assert [len(r.output_ids) for r in a.requests] == [4 + i % 9 for i in range(40)]
  assert serving.kv_pages_leaked(insts) == 0
  moved = a.transfers[0]
  assert moved["ok"] and moved["bytes"] == insts[0].kv_bytes(2)   # r0: 20 tokens = 2 pages
  assert a.requests[0].ttft_s > 0 and a.requests[0].tpot_s > 0


def test_sim_cluster_larger_than_the_machine():
  result, insts = _serve_sim([("colocated", 64, 8)], "colocated", n=200, gap_s=0.0)
  assert len(insts) == 64 and all(r.status == Status.FINISHED for r in result.requests)
  assert len({r.prefill_instance for r in result.requests}) > 32


def test_run_cli_sim_backend_is_byte_identical(tmp_path):
  outs = []
  for name in ("a", "b"):
    proc = subprocess.run(
        [sys.executable, "-m", "pdjax.run", "--config=configs/default.py:smoke",
         "--config.backend=sim", "--config.cluster.colocated.instances=16",
         "--config.cluster.decode.instances=12", f"--workdir={tmp_path / name}",
         "--config.progress=False"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    outs.append({m: (tmp_path / name / m / "requests.jsonl").read_bytes()
                 for m in ("colocated", "chunked", "disaggregated")})
  assert outs[0] == outs[1]
  summary = json.loads((tmp_path / "a" / "disaggregated" / "summary.json").read_text())
  assert summary["requests"]["finished"] == 8 and summary["compiles"] == 0


def test_idle_workers_are_not_replanned_every_turn():
  """Event-driven dispatch: 8 workers, one request of 4 tokens. The first turn plans on every
  worker; after that only the worker whose step ended plans again (prefill, 3 decodes, then an
  empty plan once the request is done): 8 + 4 plans, not 8 per loop turn."""
  from pdjax.scheduler import policies as policy_lib
  from pdjax.scheduler.driver import Driver, DriverOptions
  from pdjax.scheduler.instance_queue import InstanceQueue
  clock = ManualClock()
  opts = EngineOptions(page_size=16, num_pages=64, max_model_len=512, prefill_buckets=(512,),
                       max_prefill_seqs=4, decode_buckets=(16,))
  insts = build_sim_instances([("colocated", 8, 1)], PRESETS["tiny"], opts, hardware="a100",
                              clock=clock)
  names = dict(prefill_router="round_robin", decode_router="round_robin", path="always_disagg",
               admission="none", colocated_policy="prefill_first", role_switch="none")
  policies = policy_lib.build(names, dict(token_budget=512, max_prefill_seqs=4))
  plans = []
  real_plan = policies.step.plan
  policies.step.plan = lambda w, admit: plans.append(w.name) or real_plan(w, admit)
  driver = Driver("colocated", [InstanceQueue(i, i.role, 16) for i in insts], clock=clock,
                  options=serving.driver_options(opts, 16), policies=policies)
  req = Request(id="r0", arrival_s=0.0, prompt_ids=[5] * 20,
                sampling=SamplingParams(max_new_tokens=4))
  result = driver.run([req])
  assert result.requests[0].status == Status.FINISHED and len(req.output_ids) == 4
  assert plans == [f"colocated-{i}" for i in range(8)] + ["colocated-0"] * 4


def test_tier_kv_pools_and_their_validation():
  """cluster.<role>.kv_pages sizes that tier's pools (0: kv.pages_per_instance); a pool that
  cannot hold one max_model_len sequence is a one-line config error."""
  from pdjax import config as config_lib
  from pdjax.runner.execute import execute
  cfg = config_lib.load_config_module("configs/default.py").get_config("smoke")
  cfg.backend, cfg.mode, cfg.progress = "sim", "disaggregated", False
  cfg.cluster.decode.kv_pages = 96
  mcfg = config_lib.validate(cfg)
  summary, result, instances = execute(cfg, mcfg, "disaggregated", None, quiet=True)
  assert {i.name: i.tables.allocator.num_pages for i in instances} == {
      "prefill-0": 256, "prefill-1": 256, "decode-0": 96, "decode-1": 96}
  assert summary["requests"]["finished"] == 8 and summary["kv_pages_leaked"] == 0
  cfg.cluster.prefill.kv_pages = 16
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg)
  assert str(e.value) == ("cluster.prefill.kv_pages=16 cannot hold one max_model_len sequence "
                          "(32 pages); 0 means kv.pages_per_instance")
