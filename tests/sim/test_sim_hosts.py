"""An instance that spans hosts, in the simulator (issue 48, item 4): a TP ring over H > 1 hosts
runs its all-reduces at the inter-host link (dcn_bytes_per_s, the ring's slowest hop) with the
ICI per-step latency; the presets say how many chips a host holds; a tier that puts more chips
on a host than the hardware's hosts hold is a one-line config error. Step times by hand."""

import json
import subprocess
import sys

import pytest

from helpers.paths import ROOT
from pdjax import config as config_lib
from pdjax.configs import default
from pdjax.engine.options import EngineOptions
from pdjax.models.llama_config import LlamaConfig
from pdjax.scheduler.clock import ManualClock
from pdjax.sim.hardware import HARDWARE, hardware_for
from pdjax.sim.instance import build_sim_instances
from pdjax.sim.roofline import RooflineCost

# Round numbers: hidden 200, 2 layers, 8 heads and 8 kv heads of 25, bf16. 1,000,000 matmul
# params (2 x (160,000 attention + 240,000 MLP) + 200,000 LM head), 2,400,000 weight bytes
# (with the embedding), 1,600 KV bytes per token.
CFG = LlamaConfig(vocab_size=1000, hidden_size=200, intermediate_size=400, num_layers=2,
                  num_heads=8, num_kv_heads=8, head_dim=25)
# A chip with 4 per host: ICI 1e8 B/s per direction and 1 us per ring step, DCN 1e7 B/s.
CHIP = dict(bf16_flops=1e12, hbm_bytes=1e9, hbm_bytes_per_s=1e9, link_bytes_per_s=5e7,
            ici_bytes_per_s=1e8, ici_latency_s=1e-6, chips_per_host=4, dcn_bytes_per_s=1e7)
DECODE = [10, 30, 50, 70]   # a batch of 4, contexts summing to 160


def _chip_file(tmp_path, name="four_per_host", **fields):
  path = tmp_path / f"{name}.json"
  path.write_text(json.dumps({**CHIP, **fields}))
  return str(path)


def _cost(hw, hosts):
  return RooflineCost(CFG, hw, 8, dtype_bytes=2, eff_flops=1.0, eff_bw=1.0,
                      step_overhead_s=0.0, hosts=hosts)


def test_tp8_decode_step_over_two_hosts_pays_dcn_by_hand(tmp_path):
  """TP8, batch 4. Memory: (2,400,000 + 1,600 x 160) bytes / (1e9 x 8) = 332 us (compute:
  8,256,000 FLOPs / 8e12 = 1.032 us). Comm: 2 layers x 2 all-reduces of 4 x 200 x 2 = 1,600
  bytes, each 14/8 x 1,600 = 2,800 bytes per chip in 14 steps of 1 us:
    1 host:  2,800 / 1e8 + 14 us = 42 us,  x 4 = 168 us:   step 500 us
    2 hosts: 2,800 / 1e7 + 14 us = 294 us, x 4 = 1,176 us: step 1,508 us."""
  hw = hardware_for(_chip_file(tmp_path))
  assert (hw.chips_per_host, hw.dcn_bytes_per_s) == (4, 1e7)
  one, two = _cost(hw, 1), _cost(hw, 2)
  assert one.allreduce_s(1600) == pytest.approx(42e-6, rel=1e-12)
  assert two.allreduce_s(1600) == pytest.approx(294e-6, rel=1e-12)
  assert one.decode_s(DECODE) == pytest.approx(500e-6, rel=1e-12)
  assert two.decode_s(DECODE) == pytest.approx(1508e-6, rel=1e-12)
  # the chain's vectorised steps agree with decode_s to the bit, over hosts too
  assert two.decode_s_floor() == two.decode_s([1])


def test_one_host_is_todays_cost_and_a_file_without_dcn_keeps_ici(tmp_path):
  hw = hardware_for(_chip_file(tmp_path))
  plain = RooflineCost(CFG, hw, 8, dtype_bytes=2)
  assert plain.decode_s(DECODE) == RooflineCost(CFG, hw, 8, dtype_bytes=2, hosts=1).decode_s(
      DECODE)
  no_dcn = {k: v for k, v in CHIP.items() if k != "dcn_bytes_per_s"}
  path = tmp_path / "no_dcn.json"
  path.write_text(json.dumps(no_dcn))
  bare = hardware_for(str(path))
  assert bare.dcn_bytes_per_s is None
  assert _cost(bare, 2).decode_s(DECODE) == _cost(bare, 1).decode_s(DECODE)


def test_sim_instances_take_each_tiers_hosts(tmp_path):
  path = _chip_file(tmp_path)
  opts = EngineOptions(page_size=16, num_pages=64, max_model_len=256, prefill_buckets=(256,),
                       max_prefill_seqs=4, decode_buckets=(4,), dtype="bfloat16")
  insts = build_sim_instances([("prefill", 1, 8), ("decode", 2, 8)], CFG, opts, hardware=path,
                              clock=ManualClock(), hosts_by_role={"decode": 2})
  assert [(i.name, i.cost.tp, i.cost.hosts) for i in insts] == [
      ("prefill-0", 8, 1), ("decode-0", 8, 2), ("decode-1", 8, 2)]
  default_cost = RooflineCost(CFG, hardware_for(path), 8, dtype_bytes=2)
  assert insts[0].cost == default_cost
  assert insts[1].cost == RooflineCost(CFG, hardware_for(path), 8, dtype_bytes=2, hosts=2)
  assert insts[1].cost.decode_s(DECODE) > insts[0].cost.decode_s(DECODE)


def test_presets_hosts_and_dcn():
  got = {n: (h.chips_per_host, h.dcn_bytes_per_s) for n, h in HARDWARE.items()}
  assert got == {"tpu_v5e": (8, 3.125e9), "tpu_v5p": (4, 6.25e9), "tpu_v6e": (8, 12.5e9),
                 "tpu_v7x": (4, 12.5e9), "a100": (8, 25e9), "h100": (8, 50e9),
                 "h200": (8, 50e9), "b200": (8, 50e9), "mi300x": (8, 50e9)}
  v5e = HARDWARE["tpu_v5e"]
  assert [v5e.hosts_for(tp) for tp in (1, 8, 12, 16, 24)] == [1, 1, 2, 2, 3]
  assert HARDWARE["tpu_v5p"].hosts_for(10) == 5      # ceil(10 / 4) = 3 does not divide 10
  assert v5e.ring_bytes_per_s(1) == 200e9 and v5e.ring_bytes_per_s(2) == 3.125e9


def test_a_bad_chips_per_host_in_a_file_is_one_line(tmp_path):
  cfg = default.get_config("smoke")
  cfg.backend = "sim"
  for i, (value, why) in enumerate(((2.5, "must be an integer >= 1"),
                                     (0, "must be a finite number > 0"))):
    cfg.sim.hardware = _chip_file(tmp_path, f"bad{i}", chips_per_host=value)
    with pytest.raises(config_lib.ConfigError) as e:
      config_lib.validate(cfg, device_count=8)
    assert str(e.value) == f"sim.hardware={cfg.sim.hardware!r}: chips_per_host={value!r} {why}"


def _sim_cfg(hardware, preset, **tier):
  cfg = default.get_config("smoke")
  cfg.backend, cfg.mode, cfg.sim.hardware, cfg.model.preset = "sim", "disaggregated", hardware, \
      preset
  cfg.model.dtype = "bfloat16"
  for key, value in tier.items():
    cfg.cluster.decode[key] = value
  return cfg


def test_more_chips_on_a_host_than_the_hardware_holds_is_a_config_error():
  cfg = _sim_cfg("tpu_v5e", "llama_65b", tp=16)
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg)
  assert str(e.value) == ("cluster.decode.tp=16 over hosts=1 puts 16 chips on one host; "
                          "hardware tpu_v5e has 8 per host (set cluster.decode.hosts=2)")
  cfg = _sim_cfg("tpu_v5p", "llama_65b", tp=16, hosts=2)
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg)
  assert str(e.value) == ("cluster.decode.tp=16 over hosts=2 puts 8 chips on each host; "
                          "hardware tpu_v5p has 4 per host (set cluster.decode.hosts=4)")
  config_lib.validate(_sim_cfg("tpu_v5e", "llama_65b", tp=16, hosts=2))   # 8 per host: fine
  # a tier that does not run is not held to it (colocated runs no decode tier)
  cfg = _sim_cfg("tpu_v5e", "llama_65b", tp=16)
  cfg.mode = "colocated"
  config_lib.validate(cfg)


def test_the_command_says_it_in_one_line():
  proc = subprocess.run(
      [sys.executable, "-m", "pdjax.run", "--config=configs/default.py:smoke",
       "--config.backend=sim", "--config.mode=disaggregated", "--config.sim.hardware=tpu_v5p",
       "--config.model.preset=llama3_8b", "--config.cluster.decode.tp=8"],
      cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert proc.returncode != 0
  assert proc.stderr.strip().splitlines()[-1] == (
      "config error: cluster.decode.tp=8 over hosts=1 puts 8 chips on one host; hardware "
      "tpu_v5p has 4 per host (set cluster.decode.hosts=2)")


def test_a_sim_run_prices_each_tiers_hosts(tmp_path):
  """The runner builds sim instances with each tier's hosts (runner/build.py): a decode tier
  over 2 hosts pays DCN, the prefill tier on one host does not, and the run's decode steps
  are slower than the same run with hosts=1 (a file chip with 4 per host: TP2 fits one)."""
  from pdjax.runner.execute import execute
  chip = _chip_file(tmp_path)
  runs = {}
  for hosts in (1, 2):
    cfg = default.get_config("smoke")
    cfg.backend, cfg.mode, cfg.sim.hardware = "sim", "disaggregated", chip
    cfg.cluster.decode.update(instances=1, tp=2, hosts=hosts)
    cfg.cluster.prefill.update(instances=1, tp=2)
    summary, result, instances = execute(cfg, config_lib.validate(cfg), "disaggregated", None,
                                         quiet=True)
    assert [(i.role, i.cost.hosts) for i in instances] == [("prefill", 1), ("decode", hosts)]
    assert summary["kv_pages_leaked"] == 0
    runs[hosts] = summary["tpot_s"]["mean"]
  assert runs[2] > runs[1]
