"""The planner's placements respect the hardware's hosts (issue 48, item 4): an instance of TP
chips spans ceil(TP / chips_per_host) hosts (a divisor of TP) in the config each placement runs
under, so its TP all-reduces pay the inter-host link and the sim's host check passes.

A 65B-class model in bf16 (130 GB of weights) needs more than one 8-chip tpu_v5e host (128 GB):
its only placement on 16 chips is TP16, over 2 hosts. (Llama-3-70B cannot be sharded 16 ways
in pdjax: TP must divide its 8 kv heads, so on v5e it fits no placement; llama_65b has 64.)"""

import pytest

from pdjax import config as config_lib
from pdjax.planning import placement_runs as runs
from pdjax.planning.search import Placement, placements


def _cfg(preset="llama_65b", hardware="tpu_v5e"):
  cfg = config_lib.load_config_module("configs/plan_default.py").get_config()
  cfg.backend, cfg.sim.hardware, cfg.model.preset = "sim", hardware, preset
  cfg.model.dtype = "bfloat16"
  cfg.kv.max_model_len = 2048
  return cfg, config_lib.validate(cfg)


def test_65b_on_v5e_is_planned_at_tp16_over_two_hosts():
  cfg, mcfg = _cfg()
  candidates = [p for p in placements(16, (4, 8, 16), lambda t: runs.tp_ok(mcfg, t))
                if runs.fits(cfg, mcfg, p)]
  assert candidates == [Placement("colocated", (("colocated", 1, 16),)),
                        Placement("chunked", (("colocated", 1, 16),))]
  run_cfg = runs.placement_config(cfg, mcfg, candidates[0], 1.0)
  assert (run_cfg.cluster.colocated.tp, run_cfg.cluster.colocated.hosts) == (16, 2)
  # the tiers that do not run take the same TP, and so the same hosts
  assert [run_cfg.cluster[r].hosts for r in ("prefill", "decode")] == [2, 2]
  config_lib.validate(run_cfg)
  run_cfg.cluster.colocated.hosts = 1     # what it ran on before: 16 chips on one host
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(run_cfg)
  assert str(e.value) == ("cluster.colocated.tp=16 over hosts=1 puts 16 chips on one host; "
                          "hardware tpu_v5e has 8 per host (set cluster.colocated.hosts=2)")


def test_each_tier_gets_its_own_hosts_and_one_host_stays_one():
  cfg, mcfg = _cfg("llama3_8b", "tpu_v5p")          # 4 chips per host
  p = Placement("disaggregated", (("prefill", 1, 8), ("decode", 2, 4)))
  run_cfg = runs.placement_config(cfg, mcfg, p, 1.0)
  got = {r: (run_cfg.cluster[r].tp, run_cfg.cluster[r].hosts)
         for r in ("prefill", "decode", "colocated")}
  assert got == {"prefill": (8, 2), "decode": (4, 1), "colocated": (8, 2)}
  assert [runs.tier_hosts(cfg, tp) for tp in (1, 2, 4, 8, 16)] == [1, 1, 1, 2, 4]


def test_llama3_70b_cannot_take_tp16():
  cfg, mcfg = _cfg("llama3_70b")
  assert [t for t in (1, 2, 4, 8, 16) if runs.tp_ok(mcfg, t)] == [1, 2, 4, 8]
  assert not [p for p in placements(16, (8,), lambda t: runs.tp_ok(mcfg, t))
              if runs.fits(cfg, mcfg, p)]
