"""A bad config exits non-zero with exactly one line naming the key (no traceback)."""

import subprocess
import sys

import pytest

from pdjax import config as config_lib

CASES = [
    (["--config.workload.rate=-1"],
     "config error: workload.rate=-1.0 must be >= 0.0001 requests per second (arrivals "
     "further apart lose the clock's precision: at 1e-300 every duration rounded away)"),
    (["--config.mode=bogus"],
     "config error: mode='bogus' is not one of ['colocated', 'disaggregated', 'hybrid', "
     "'compare', 'compare_all']"),
    (["--config.cluster.prefill.tp=3"],
     "config error: cluster.prefill.tp=3 does not divide the model's num_kv_heads=4"),
    (["--config.cluster.colocated.instances=5"],
     "config error: cluster.colocated.instances=5 x tp=2 needs 10 devices, only 8 available"),
    (["--config.mode=disaggregated", "--config.cluster.decode.instances=3"],
     "config error: cluster.prefill.instances=2 x tp=2 + cluster.decode.instances=3 x tp=2 "
     "needs 10 devices, only 8 available"),
    (["--config.workload.bogus=1"], "config error: no key workload.bogus"),
    (["--config.workload.rat=1"],
     "config error: no key workload.rat (did you mean workload.rate?)"),
    (["--config.scheduler.prefil_router=x"],
     "config error: no key scheduler.prefil_router (did you mean scheduler.prefill_router?)"),
    (["--config.sed=1"], "config error: no key sed (did you mean seed?)"),
    (["--config.workloda.rate=1"], "config error: no key workloda (did you mean workload?)"),
    (["--config=configs/default.py:smoke", "--config.cluster.prefill.tpp=1"],
     "config error: no key cluster.prefill.tpp (did you mean cluster.prefill.tp?)"),
    (["--config=/nonexistent/given.py"], "config error: no config file /nonexistent/given.py"),
    (["--config=/nonexistent/given.py", "--config.seed=1"],
     "config error: no config file /nonexistent/given.py"),
    (["--config=configs/default.py:bogus"], "config error: config file configs/default.py:bogus "
     "raised ValueError: unknown variant 'bogus' (known: smoke)"),
    (["--config.scheduler.path=shortest"],
     "config error: scheduler.path='shortest' is not one of ['always_colocated', "
     "'always_disagg', 'isl_bounding', 'length_hybrid', 'load_hybrid', 'prefix_hybrid', "
     "'slo_headroom', 'taichi'] (or a module:Attr import path)"),
    (["--config.workload.kind=foo"],
     "config error: workload.kind='foo' is not one of ['synthetic', 'azure', 'mooncake', "
     "'burstgpt', 'jsonl', 'python']"),
    (["--config.workload.kind=azure"],
     "config error: workload.path='' is required for kind=azure"),
    (["--config.scheduler.chunk_budget=2000"],
     "config error: scheduler.chunk_budget=2000 must be within [1, 1792] (the largest prefill "
     "bucket)"),
    (["--config.cluster.launcher=slurm"],
     "config error: cluster.launcher='slurm' is not one of ['local', 'ray']"),
    (["--config.cluster.launcher=ray", "--config.backend=sim"],
     "config error: cluster.launcher='ray' needs backend='jax' (the simulator runs in one "
     "process), got 'sim'"),
    (["--config.cluster.launcher=ray", "--config.cluster.pull_timeout_s=0"],
     "config error: cluster.pull_timeout_s=0.0 must be a finite number > 0"),
    (["--config.cluster.launcher=ray", "--config.cluster.collective_timeout_s=-1"],
     "config error: cluster.collective_timeout_s=-1.0 must be a finite number > 0"),
    (["--config.cluster.prefill.tp=4", "--config.cluster.prefill.hosts=3"],
     "config error: cluster.prefill.hosts=3 does not divide cluster.prefill.tp=4 (each host "
     "owns tp / hosts devices)"),
    (["--config.cluster.decode.hosts=0"],
     "config error: cluster.decode.hosts=0 must be an integer >= 1"),
    (["--config.cluster.colocated.hosts=2"],
     "config error: cluster.colocated.hosts=2 needs cluster.launcher='ray' (one process per "
     "host)"),
    (["--config.cluster.launcher=ray", "--config.cluster.ray_accelerator=npu"],
     "config error: cluster.ray_accelerator='npu' is not one of ['auto', 'cpu', 'gpu', 'tpu']"),
    (["--config.scheduler.role_switch=remesh", "--config.scheduler.remesh_schedule=decode:1x2@1"],
     "config error: scheduler.remesh_schedule entry 'decode:1x2' needs 2 devices; the decode "
     "tier has 4"),
    (["--config.scheduler.isl_ratio=1.5"],
     "config error: scheduler.isl_ratio=1.5 must be in (0, 1]"),
    (["--config.scheduler.local_prefill=split"],
     "config error: scheduler.local_prefill='split' is not one of ['whole', 'chunked']"),
    (["--config.output.trace_steps=some"],
     "config error: output.trace_steps='some' is not one of ['auto', 'full']"),
    (["--config.model.param_layout=flat"],
     "config error: model.param_layout='flat' is not one of ['auto', 'stacked', 'unrolled']"),
    (["--config.model.param_layout=unrolled"],
     "config error: cluster.prefill.tp=2 must be 1 with model.param_layout='unrolled'"),
    (["--config.workload.rate=abc"],
     "config error: flag --config.workload.rate=abc: could not convert string to float: 'abc'"),
]


@pytest.mark.parametrize("args,message", CASES, ids=[c[0][-1] for c in CASES])
def test_config_error_is_one_line(args, message):
  proc = subprocess.run([sys.executable, "-m", "pdjax.run", *args, "--workdir=/nonexistent/x"],
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2
  assert proc.stderr.strip() == message
  assert proc.stdout == ""


@pytest.mark.parametrize("source, error", [
    ("raise RuntimeError('boom here')\n", "RuntimeError: boom here"),
    ("def get_config(:\n", "SyntaxError: invalid syntax (broken.py, line 1)"),
    ("def get_config():\n  return {}['x']\n", "KeyError: 'x'"),
], ids=["raises", "syntax", "get_config_raises"])
def test_config_file_that_raises_is_one_line(tmp_path, source, error):
  path = tmp_path / "broken.py"
  path.write_text(source)
  proc = subprocess.run([sys.executable, "-m", "pdjax.run", f"--config={path}",
                         "--workdir=/nonexistent/x"], capture_output=True, text=True, timeout=300)
  assert (proc.returncode, proc.stderr.strip(), proc.stdout) == (
      2, f"config error: config file {path} raised {error}", "")


def test_unknown_key_message_without_a_close_key():
  from pdjax.cli import unknown_key_message
  known = ["seed", "workload", "workload.rate", "workload.kind"]
  assert unknown_key_message("workload.rat", known) == (
      "config error: no key workload.rat (did you mean workload.rate?)")
  assert unknown_key_message("rate", known) == (
      "config error: no key rate (did you mean workload.rate?)")
  assert unknown_key_message("workload.zzz", known) == "config error: no key workload.zzz"


def test_validate_checks_in_process():
  import importlib.util
  spec = importlib.util.spec_from_file_location("default_cfg", "configs/default.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  cfg = module.get_config()
  assert config_lib.validate(cfg, device_count=8).num_kv_heads == 4
  cfg.kv.pages_per_instance = 10
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg)
  assert str(e.value) == ("kv.pages_per_instance=10 cannot hold one max_model_len sequence "
                          "(116 pages)")


@pytest.mark.parametrize("key, value, message", [
    ("tenant_quota_pages", -1, "kv.tenant_quota_pages=-1 must be >= 0 (0: no quota)"),
    ("cache_pages", -5, "kv.cache_pages=-5 must be >= 0 (0: the whole pool)"),
    ("ttl_s", -1.0, "kv.ttl_s=-1.0 must be >= 0 (0: never)"),
])
def test_prefix_cache_and_quota_keys(key, value, message):
  cfg = config_lib.load_config_module("configs/default.py").get_config()
  cfg.kv[key] = value
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg)
  assert str(e.value) == message


@pytest.mark.parametrize("section, key, value, message", [
    ("kv", "eviction", "mru", "kv.eviction='mru' is not one of lru, lfu"),
    ("kv", "transfer_failure_policy", "ignore", "kv.transfer_failure_policy='ignore' is not one "
     "of retry_then_recompute, fail"),
    ("kv", "transfer_retries", -1, "kv.transfer_retries=-1 must be an integer >= 0"),
    ("kv", "lease_s", -2.0, "kv.lease_s=-2.0 must be a finite number >= 0"),
    ("faults", "transfer_fail_prob", 1.5, "faults.transfer_fail_prob=1.5 must be a probability "
     "in [0, 1]"),
    ("faults", "transfer_delay", "gauss:1", "faults.transfer_delay='gauss:1' is not one of "
     "const:S, exp:MEAN, uniform:LO:HI"),
    ("faults", "transfer_delay", "uniform:2:1", "faults.transfer_delay='uniform:2:1' has LO > HI"),
    ("faults", "transfer_delay", "exp:x", "faults.transfer_delay='exp:x' has 'x' where a finite "
     "number >= 0 is needed"),
    ("faults", "slow_instance", "decode-0@3", "faults.slow_instance='decode-0@3' item "
     "'decode-0@3' is not name:factor@seconds"),
    ("faults", "slow_instance", "decode-0:0.5@3", "faults.slow_instance='decode-0:0.5@3' has "
     "'0.5' where a finite number >= 1 is needed"),
    ("faults", "kill_instance", "decode-9@1", "faults.kill_instance='decode-9' is not an "
     "instance of this run (colocated-0, colocated-1, colocated-2, colocated-3, decode-0, "
     "decode-1, prefill-0, prefill-1)"),
    ("faults", "kill_instance", "decode-0", "faults.kill_instance='decode-0' item 'decode-0' is "
     "not name@seconds"),
    ("faults", "cancel_stages", "queued,later", "faults.cancel_stages='queued,later' must list "
     "some of queued, prefill, transfer_wait, transfer, decode"),
    ("faults", "restart_s", -1.0, "faults.restart_s=-1.0 must be >= 0 seconds (0: never)"),
])
def test_fault_and_recovery_keys(section, key, value, message):
  cfg = config_lib.load_config_module("configs/default.py").get_config()
  cfg[section][key] = value
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg)
  assert str(e.value) == message


def test_fault_flag_from_the_command_line_is_one_line():
  proc = subprocess.run([sys.executable, "-m", "pdjax.run", "--config.faults.cancel_prob=2",
                         "--workdir=/nonexistent/x"], capture_output=True, text=True, timeout=300)
  assert (proc.returncode, proc.stderr.strip()) == (
      2, "config error: faults.cancel_prob=2.0 must be a probability in [0, 1]")


@pytest.mark.parametrize("updates, message", [
    ({"kv.host_tier_pages": -1}, "kv.host_tier_pages=-1 must be an integer >= 0 (0: no host tier)"),
    ({"kv.host_tier_policy": "fifo"}, "kv.host_tier_policy='fifo' is not one of lru, lfu"),
    ({"kv.host_tier_pages": 64, "backend": "sim"},
     "kv.host_tier_pages=64 needs kv.prefix_cache=True (host pages are found by their prefix "
     "names)"),
    ({"kv.host_tier_pages": 64, "kv.prefix_cache": True, "cluster.launcher": "ray",
      "kv.host_tier_handoff": "host"},
     "kv.host_tier_handoff='host' needs cluster.launcher=local (with ray: transfer)"),
    ({"kv.host_tier_admission": "some"},
     "kv.host_tier_admission='some' is not one of all, reused, frequency, adaptive"),
    ({"kv.host_tier_half_life_s": 0.0},
     "kv.host_tier_half_life_s=0.0 must be a finite number > 0"),

    ({"sim.host_link_gbps": -1.0}, "sim.host_link_gbps=-1.0 must be a finite number >= 0 (0: "
     "the hardware preset's)"),
])
def test_host_tier_keys(updates, message):
  cfg = config_lib.load_config_module("configs/default.py").get_config()
  for key, value in updates.items():
    node = cfg
    *path, leaf = key.split(".")
    for part in path:
      node = node[part]
    node[leaf] = value
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg)
  assert str(e.value) == message


@pytest.mark.parametrize("handoff, pages, message", [
    ("nvme", 0, "kv.host_tier_handoff='nvme' is not one of transfer, host"),
    ("host", 0, "kv.host_tier_handoff='host' needs a host tier (kv.host_tier_pages > 0)"),
])
def test_host_tier_handoff_key(handoff, pages, message):
  cfg = config_lib.load_config_module("configs/default.py").get_config()
  cfg.kv.host_tier_handoff, cfg.kv.host_tier_pages = handoff, pages
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg)
  assert str(e.value) == message
