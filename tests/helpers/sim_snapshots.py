"""Golden snapshots of three simulator runs (summary + requests), so "the sim outputs did not
change" is checked by the suite, not claimed. The simulator is deterministic (virtual clock,
seeded workload and faults, pure-Python cost model), so the comparison is exact.

Regenerate after an intended change, and say why in the commit:
  python tests/helpers/sim_snapshots.py --write
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))   # tests/helpers
ROOT = os.path.dirname(os.path.dirname(HERE))
SNAPSHOT_DIR = os.path.join(ROOT, "tests", "snapshots")

# name -> config overrides on configs/default.py:smoke (backend=sim)
CONFIGS = {
    # colocated, chunked and disaggregated on the default mixed workload
    "base": {"mode": "compare", "workload.num_requests": 40, "workload.rate": 40.0},
    # queue_balance moves instances between the tiers under a prefill-heavy burst
    "role_switch": {"mode": "disaggregated", "workload.preset": "long_doc_qa",
                    "workload.num_requests": 40, "workload.rate": 200.0,
                    "scheduler.role_switch": "queue_balance",
                    "scheduler.role_switch_interval_s": 0.01,
                    "scheduler.role_switch_queued_tokens": 256},
    # prefix cache + KV-aware routing on multi-turn sessions, with transfer faults
    "prefix_faults": {"mode": "disaggregated", "workload.preset": "agent_multiturn",
                      "workload.num_requests": 40, "workload.rate": 40.0,
                      "kv.prefix_cache": True, "scheduler.prefill_router": "kv_aware_prefix",
                      "scheduler.decode_router": "kv_aware_prefix",
                      "faults.transfer_fail_prob": 0.2, "faults.transfer_delay": "exp:0.002"},
}


def _config(overrides: dict):
  from pdjax import config as config_lib
  cfg = config_lib.load_config_module(os.path.join(ROOT, "configs", "default.py")
                                      ).get_config("smoke")
  cfg.backend, cfg.progress = "sim", False
  for key, value in overrides.items():
    node = cfg
    *path, leaf = key.split(".")
    for part in path:
      node = node[part]
    node[leaf] = value
  return cfg


def take(name: str) -> dict:
  """{run: {"summary": ..., "requests": [...]}} of one snapshot config, as JSON-able data."""
  from pdjax import config as config_lib
  from pdjax.runner.execute import execute
  cfg = _config(CONFIGS[name])
  mcfg = config_lib.validate(cfg)
  out = {}
  for run in config_lib.modes(cfg):
    summary, result, _ = execute(cfg, mcfg, run, None, quiet=True)
    out[run] = {"summary": summary, "requests": [r.to_record() for r in result.requests]}
  return json.loads(json.dumps(out, sort_keys=True))   # tuples -> lists, as stored


def path(name: str) -> str:
  return os.path.join(SNAPSHOT_DIR, f"{name}.json")


if __name__ == "__main__":
  if sys.argv[1:] != ["--write"]:
    sys.exit("usage: python tests/helpers/sim_snapshots.py --write")
  sys.path.insert(0, ROOT)
  os.makedirs(SNAPSHOT_DIR, exist_ok=True)
  for snapshot in CONFIGS:
    with open(path(snapshot), "w") as f:
      json.dump(take(snapshot), f, sort_keys=True, indent=1)
      f.write("\n")
    print(f"wrote {path(snapshot)}")
