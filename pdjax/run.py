"""Runs an experiment from a config file: colocated, disaggregated, or both on one workload.

  python -m pdjax.run                                   # configs/default.py, mode=compare
  python -m pdjax.run --config=configs/default.py:smoke --config.workload.rate=4
  python -m pdjax.run --config.mode=disaggregated --workdir=/tmp/run1

Writes one folder per run (config.json, requests.jsonl, summary.json, report.md, trace.json,
plots/) under --workdir (default results/<config>-<timestamp>/); mode=compare runs colocated,
chunked and disaggregated into subfolders, adds compare.md, and prints a side-by-side table.
"""

from __future__ import annotations

import sys

from absl import app, flags, logging

from pdjax import config as config_lib
from pdjax.cli import (define_config_and_workdir, fail, first_and_last_line, parse_flags,
                       use_cpu_devices)
from pdjax.runner.build import ray_cluster_for
from pdjax.runner.outputs import default_workdir, write_comparison
from pdjax.runner.repeats import run_repeats

# config_flags loads the file and applies --config.* overrides right here, at import
CONFIG, WORKDIR = define_config_and_workdir()


def main(argv) -> None:
  if len(argv) > 1:
    fail(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)   # not jax's "no TPU found" chatter
  try:
    cfg = CONFIG.value
    cfg.mode  # a config file that failed to load raises here, on first use
  except OSError as e:
    fail(f"config error: cannot load --config: {first_and_last_line(str(e))}")
  try:
    mcfg = config_lib.validate(cfg)
    use_cpu_devices(cfg.num_cpu_devices)
    import jax
    config_lib.validate(cfg, device_count=jax.device_count())
  except config_lib.ConfigError as e:
    fail(f"config error: {e}")
  from pdjax.engine.cluster import enable_compile_cache, host_params
  from pdjax.metrics.compare import compare_table
  from pdjax.metrics.run_info import run_info, tiny_sim_warning

  enable_compile_cache(cfg.compile_cache_dir)
  workdir = WORKDIR.value or default_workdir(flags.FLAGS["config"].config_filename)
  # With ray, each actor reads (or seeds) its own parameters; the driver needs them only
  # for the debug check against the reference.
  in_driver = cfg.backend != "sim" and (config_lib.launcher(cfg) == "local" or cfg.debug)
  try:   # a checkpoint missing a tensor (KeyError) or holding a stray one (ValueError)
    params = (host_params(mcfg, checkpoint=cfg.model.checkpoint, seed=cfg.seed,
                          dtype=cfg.model.dtype) if in_driver else None)
  except (KeyError, ValueError) as e:
    fail(f"config error: {e.args[0]}")
  if (warning := tiny_sim_warning(run_info(cfg, mcfg, cfg.mode, []))):
    print(warning, file=sys.stderr)
  with ray_cluster_for(cfg) as ray_cluster:
    summaries, results = run_repeats(cfg, mcfg, workdir, params, ray_cluster)
  if len(summaries) > 1:
    write_comparison(workdir, summaries, results)
  print(compare_table(summaries))
  print(f"results: {workdir}")
  leaked = {m: s["kv_pages_leaked"] if "kv_pages_leaked" in s
            else s["repeats"]["metrics"]["kv_pages_leaked"]["sum"] for m, s in summaries.items()}
  if any(leaked.values()):
    fail("KV pages leaked: " + ", ".join(f"{m}={n}" for m, n in leaked.items()))


def entry_point() -> None:
  app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
  entry_point()
