"""Runs an experiment from a config file: colocated, disaggregated, or both on one workload.

  python -m pdjax.run                                   # configs/default.py, mode=compare
  python -m pdjax.run --config=configs/default.py:smoke --config.workload.rate=4
  python -m pdjax.run --config.mode=disaggregated --workdir=/tmp/run1

Writes one folder per mode (config.json, requests.jsonl, summary.json, report.md) under
--workdir (default results/<config>-<timestamp>/) and prints a side-by-side table.
"""

from __future__ import annotations

import os
import sys
import time

from absl import app, flags, logging
from ml_collections import config_flags

from pdjax import config as config_lib
from pdjax.cli import describe_config_flag_error, fail, first_and_last_line, use_cpu_devices

_DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "configs", "default.py")
try:  # config_flags loads the file and applies --config.* overrides right here, at import
  _CONFIG = config_flags.DEFINE_config_file("config", _DEFAULT_CONFIG,
                                            "Experiment config file.", lock_config=True)
except Exception as e:  # pylint: disable=broad-except
  fail(describe_config_flag_error(e, sys.argv))
_WORKDIR = flags.DEFINE_string("workdir", None, "Output folder (default results/<config>-<time>/).")


def default_workdir(config_path: str) -> str:
  name = os.path.splitext(os.path.basename(config_path.split(":")[0]))[0]
  return os.path.join("results", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")


def run_mode(cfg, mcfg, mode: str, workdir: str, host_params) -> dict:
  """Builds the mode's instances, serves the workload, writes the run folder, returns summary."""
  from tqdm import tqdm
  from pdjax.engine.cluster import build_instances
  from pdjax.metrics.report import write_run_files
  from pdjax.metrics.summary import summarize
  from pdjax import serving
  from pdjax.workload.synthetic import synthetic_requests

  opts = engine_options(cfg)
  instances = build_instances(config_lib.tiers(cfg)[mode], mcfg, host_params, opts)
  w = cfg.workload
  requests = synthetic_requests(
      num_requests=w.num_requests, rate=w.rate, seed=cfg.seed, vocab_size=mcfg.vocab_size,
      chat_fraction=w.chat_fraction, chat_prompt_len=tuple(w.chat_prompt_len),
      chat_max_new_tokens=tuple(w.chat_max_new_tokens), doc_prompt_len=tuple(w.doc_prompt_len),
      doc_max_new_tokens=tuple(w.doc_max_new_tokens), temperature=cfg.sampling.temperature,
      eos_ids=mcfg.eos_token_ids, ignore_eos=w.ignore_eos)
  with tqdm(total=len(requests), desc=f"{mode:>13}", unit="req", disable=not cfg.progress,
            file=sys.stderr) as bar:
    result = serving.serve(mode, instances, requests, on_progress=bar.update)
  summary = summarize(result.requests, mode=mode, duration_s=max(result.duration_s, 1e-9),
                      slo_ttft_s=cfg.slo.ttft_s, slo_tpot_s=cfg.slo.tpot_s,
                      transfers=result.transfers,
                      compiles=sum(i.compiles for i in instances),
                      kv_pages_leaked=serving.kv_pages_leaked(instances))
  summary["steps"] = result.steps
  write_run_files(workdir, config_dict={**cfg.to_dict(), "mode": mode}, requests=result.requests,
                  summary=summary)
  return summary


def engine_options(cfg):
  from pdjax.engine.instance import EngineOptions
  return EngineOptions(page_size=cfg.kv.page_size, num_pages=cfg.kv.pages_per_instance,
                       max_model_len=cfg.kv.max_model_len,
                       prefill_buckets=tuple(cfg.scheduler.prefill_buckets),
                       max_prefill_seqs=cfg.scheduler.max_prefill_seqs,
                       decode_buckets=tuple(cfg.scheduler.decode_buckets),
                       dtype=cfg.model.dtype, seed=cfg.seed,
                       attention_impl=cfg.model.attention_impl)


def main(argv) -> None:
  if len(argv) > 1:
    fail(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)   # not jax's "no TPU found" chatter
  try:
    cfg = _CONFIG.value
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
  from pdjax.metrics.report import compare_table

  enable_compile_cache(cfg.compile_cache_dir)
  workdir = _WORKDIR.value or default_workdir(flags.FLAGS["config"].config_filename)
  params = host_params(mcfg, checkpoint=cfg.model.checkpoint, seed=cfg.seed, dtype=cfg.model.dtype)
  modes = config_lib.modes(cfg)
  summaries = {}
  for mode in modes:
    mode_dir = os.path.join(workdir, mode) if len(modes) > 1 else workdir
    summaries[mode] = run_mode(cfg, mcfg, mode, mode_dir, params)
  print(compare_table(summaries))
  print(f"results: {workdir}")
  if any(s["kv_pages_leaked"] for s in summaries.values()):
    fail("KV pages leaked: " + ", ".join(f"{m}={s['kv_pages_leaked']}"
                                          for m, s in summaries.items()))


def _parse_flags(argv):
  """absl's parser, but a bad flag or config key is one line on stderr, not a usage dump."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    fail(f"config error: {first_and_last_line(str(e))}")


def entry_point() -> None:
  app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
  entry_point()
