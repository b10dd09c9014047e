"""Runs an experiment from a config file: colocated, disaggregated, or both on one workload.

  python -m pdjax.run                                   # configs/default.py, mode=compare
  python -m pdjax.run --config=configs/default.py:smoke --config.workload.rate=4
  python -m pdjax.run --config.mode=disaggregated --workdir=/tmp/run1

Writes one folder per run (config.json, requests.jsonl, summary.json, report.md, trace.json,
plots/) under --workdir (default results/<config>-<timestamp>/); mode=compare runs colocated,
chunked and disaggregated into subfolders, adds compare.md, and prints a side-by-side table.
"""

from __future__ import annotations

import json
import os
import sys
import time

from absl import app, flags, logging
from ml_collections import config_flags

from pdjax import config as config_lib
from pdjax.engine import options as options_lib
from pdjax.cli import (describe_config_flag_error, fail, first_and_last_line, parse_flags,
                       use_cpu_devices)

# Shipped inside the package (pdjax/configs/), so an installed pdjax finds it from any cwd.
_DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs",
                               "default.py")
try:  # config_flags loads the file and applies --config.* overrides right here, at import
  CONFIG = config_flags.DEFINE_config_file("config", _DEFAULT_CONFIG,
                                            "Experiment config file.", lock_config=True)
except Exception as e:  # pylint: disable=broad-except
  fail(describe_config_flag_error(e, sys.argv))
WORKDIR = flags.DEFINE_string("workdir", None, "Output folder (default results/<config>-<time>/).")


def default_workdir(config_path: str) -> str:
  name = os.path.splitext(os.path.basename(config_path.split(":")[0]))[0]
  return os.path.join("results", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")


def _overlap(cfg):
  """scheduler.overlap as serving.serve takes it (a command-line override arrives as text)."""
  value = cfg.scheduler.get("overlap", "auto")
  return value.lower() if isinstance(value, str) else value


def policies_for(cfg, run: str, opts):
  """The scheduling policies of one run (run: colocated | chunked | disaggregated)."""
  from pdjax.scheduler import policies as policy_lib
  sc = cfg.scheduler
  names = {key: sc[key] for key in policy_lib.CHOICES}
  if run == "chunked":
    names["colocated_policy"] = "chunked_prefill"
  elif cfg.mode == "compare" or run == "disaggregated":
    names["colocated_policy"] = "prefill_first"   # the plain baseline; D steps are decodes
  params = dict(token_budget=max(opts.prefill_buckets), chunk_budget=sc.chunk_budget,
                max_prefill_seqs=opts.max_prefill_seqs, length_threshold=sc.length_threshold,
                saturation=sc.saturation, max_queue=sc.max_queue, slo_ttft_s=cfg.slo.ttft_s,
                slo_tpot_s=cfg.slo.tpot_s, interval_s=sc.role_switch_interval_s,
                queued_tokens=sc.role_switch_queued_tokens, shared_salt=cfg.kv.shared_salt,
                headroom=sc.get("admission_headroom", 1.0))
  return policy_lib.build(names, params, seed=cfg.seed)


def build_run(cfg, mcfg, run: str, host_params, ray_cluster=None, progress=None):
  """The instances of one run (real, simulated, or Ray actors) and what serving.serve takes
  besides them: (mode, instances, serve kwargs: policies, injector, clock / transfer_fn for
  the simulator and Ray, and the DriverOptions the config sets). progress(done, total, what):
  each program the real engine compiles in this process (engine.cluster.build_instances)."""
  from pdjax.faults.injector import FaultInjector
  chunked = run == "chunked" or (run == "colocated" and
                                 cfg.scheduler.colocated_policy == "chunked_prefill")
  opts = options_lib.engine_options(cfg, chunked=chunked)
  mode = config_lib.RUNS[run]
  tiers = config_lib.tiers(cfg)[mode]
  serve_kwargs = {}
  if cfg.backend == "sim":
    from pdjax.scheduler.clock import ManualClock
    from pdjax.sim.instance import build_sim_instances, sim_transfer
    clock = ManualClock()
    instances = build_sim_instances(tiers, mcfg, opts, hardware=cfg.sim.hardware, clock=clock,
                                    link_gbps=cfg.sim.link_gbps,
                                    dtype_bytes=2 if cfg.model.dtype == "bfloat16" else 4,
                                    profile=config_lib.sim_profile(cfg, mcfg),
                                    opts_by_role=options_lib.tier_options(cfg, opts))
    serve_kwargs = dict(clock=clock, transfer_fn=sim_transfer,
                        fast_forward=bool(cfg.sim.get("fast_forward", True)))
  elif ray_cluster is not None:
    instances = ray_cluster.build_instances(
        tiers, mcfg, opts, checkpoint=cfg.model.checkpoint, seed=cfg.seed,
        roles_may_change=cfg.scheduler.role_switch != "none",
        opts_by_role=options_lib.tier_options(cfg, opts))
    serve_kwargs = dict(transfer_fn=ray_cluster.transfer_fn)
  else:
    from pdjax.engine.cluster import build_instances
    instances = build_instances(tiers, mcfg, host_params, opts,
                                roles_may_change=cfg.scheduler.role_switch != "none",
                                opts_by_role=options_lib.tier_options(cfg, opts),
                                progress=progress)
  if cfg.kv.prefix_cache:
    for inst in instances:
      inst.tables.enable_prefix_cache(cfg.kv.cache_pages, cfg.kv.ttl_s, cfg.kv.eviction)
  if cfg.kv.get("host_tier_pages", 0):   # one node: every instance shares one host tier
    from pdjax.kv.host_tier import HostTier
    from pdjax.sim.hardware import HARDWARE
    tier = HostTier(cfg.kv.host_tier_pages, cfg.kv.host_tier_policy)
    gbps = cfg.sim.get("host_link_gbps", 0.0)
    link = gbps * 1e9 / 8 if gbps else HARDWARE[cfg.sim.hardware].host_bytes_per_s
    handoff = cfg.kv.get("host_tier_handoff", "transfer")
    for inst in instances:
      inst.attach_host_tier(tier, link, handoff)
    if handoff == "host" and cfg.backend == "jax":
      from pdjax.engine.host_copies import transfer_through_host_tier
      serve_kwargs["transfer_fn"] = transfer_through_host_tier
  kv = cfg.kv
  serve_kwargs.update(policies=policies_for(cfg, run, opts),
                      injector=FaultInjector(config_lib.fault_spec(cfg)),
                      shared_salt=kv.shared_salt, tenant_quota_pages=kv.tenant_quota_pages,
                      flush_schedule=config_lib.flush_schedule(cfg), vocab_size=mcfg.vocab_size,
                      transfer_failure_policy=kv.transfer_failure_policy,
                      transfer_retries=kv.transfer_retries,
                      transfer_backoff_s=kv.transfer_backoff_s,
                      transfer_timeout_s=kv.transfer_timeout_s, lease_s=kv.lease_s,
                      debug=cfg.debug, overlap=_overlap(cfg))
  return mode, instances, serve_kwargs


def summarize_run(cfg, run: str, result, instances, problems=()) -> dict:
  """summary.json of a served run."""
  from pdjax import serving
  from pdjax.metrics.faults import fault_summary
  from pdjax.metrics.kv_cache import kv_cache_summary
  from pdjax.metrics.summary import summarize, summarize_extras
  duration = max(result.duration_s, 1e-9)
  summary = summarize(result.requests, mode=run, duration_s=duration,
                      slo_ttft_s=cfg.slo.ttft_s, slo_tpot_s=cfg.slo.tpot_s,
                      transfers=result.transfers,
                      compiles=sum(i.compiles for i in instances),
                      compiles_from_cache=sum(getattr(i, "compiles_from_cache", 0)
                                              for i in instances),
                      kv_pages_leaked=serving.kv_pages_leaked(instances))
  summary.update(summarize_extras(result.requests, duration_s=duration, steps=result.steps,
                                  samples=result.samples, role_switches=result.role_switches))
  summary["kv_cache"] = kv_cache_summary(result.requests, instances, samples=result.samples,
                                         flushes=result.flushes)
  summary["faults"] = fault_summary(result.requests, result.faults)
  summary["steps"] = result.step_counts()
  summary["workload_problems"] = list(problems)
  return summary


_LOADED: dict = {}   # the last workload loaded: (requests never served, problems)


def _file_state(path: str):
  """A trace file's identity for the workload cache (a rewritten file is loaded again)."""
  try:
    st = os.stat(path)
  except (OSError, ValueError):   # no file (synthetic): the config alone decides
    return None
  return (st.st_mtime_ns, st.st_size, st.st_ino)


def run_info_of(cfg, mcfg, run: str, **kwargs) -> dict:
  """summary.json's run_info of one run of cfg (pdjax.metrics.run_info.run_info)."""
  from pdjax.metrics.run_info import run_info
  return run_info(cfg, mcfg, run, config_lib.tiers(cfg)[config_lib.RUNS[run]],
                  devices=_devices(cfg), **kwargs)


def _devices(cfg) -> dict | None:
  """The real engine's devices as run_info names them (None on the simulator)."""
  if cfg.backend == "sim":
    return None
  import jax
  device = jax.devices()[0]
  return {"platform": device.platform, "device_kind": device.device_kind,
          "devices": jax.device_count(),
          **({"launcher": "ray"} if config_lib.launcher(cfg) == "ray" else {})}


def execute(cfg, mcfg, run: str, host_params, on_progress=None, quiet: bool = False,
            on_loaded=None, ray_cluster=None):
  """Builds the run's instances (real or simulated), serves the workload; returns (summary,
  RunResult, instances). Writes nothing. on_loaded(n) is called with the number of requests
  the workload loaded, before serving (a trace may hold fewer than workload.num_requests).
  ray_cluster: a started `distributed.launcher.RayCluster` (cluster.launcher=ray): each
  instance is an actor in its own process, stopped when the run's summary is taken."""
  from pdjax import serving
  from pdjax.workload.loader import load_workload

  mode, instances, serve_kwargs = build_run(cfg, mcfg, run, host_params, ray_cluster)
  key = (json.dumps(cfg.workload.to_dict(), sort_keys=True, default=str), cfg.seed,
         mcfg.vocab_size, tuple(mcfg.eos_token_ids), cfg.kv.max_model_len,
         cfg.sampling.temperature, _file_state(cfg.workload.get("path", "")))
  if key not in _LOADED:    # mode=compare's runs serve the same workload: loaded once
    _LOADED.clear()
    _LOADED[key] = load_workload(cfg.workload, seed=cfg.seed, vocab_size=mcfg.vocab_size,
                                 eos_ids=mcfg.eos_token_ids, max_model_len=cfg.kv.max_model_len,
                                 temperature=cfg.sampling.temperature)
  pristine, problems = _LOADED[key]
  requests = [r.fresh_copy() for r in pristine]
  for line in problems if not quiet else ():
    print(f"workload: {line}", file=sys.stderr)
  if on_loaded is not None:
    on_loaded(len(requests))
  result = serving.serve(mode, instances, requests, on_progress=on_progress, **serve_kwargs)
  if cfg.debug and cfg.backend == "jax":
    from pdjax.engine.cluster import as_host   # an orbax checkpoint is read whole only here
    serving.check_outputs_alone(result.requests, mcfg, as_host(host_params),
                                dtype=cfg.model.dtype)
  summary = summarize_run(cfg, run, result, instances, problems)
  summary["run_info"] = run_info_of(cfg, mcfg, run, requests=len(requests))
  if ray_cluster is not None:
    ray_cluster.release(instances)   # their processes end; the next run starts its own
  return summary, result, instances


def run_mode(cfg, mcfg, run: str, workdir: str, host_params,
             ray_cluster=None) -> tuple[dict, object]:
  """Serves one run (see `execute`) and writes its folder (files, plots, trace.json);
  returns (summary, RunResult)."""
  from tqdm import tqdm

  def set_total(n: int) -> None:   # the requests actually loaded, not workload.num_requests
    bar.total = n
    bar.refresh()

  with tqdm(total=None, desc=f"{run:>13}", unit="req", disable=not cfg.progress,
            file=sys.stderr) as bar:
    summary, result, _ = execute(cfg, mcfg, run, host_params, on_progress=bar.update,
                                 on_loaded=set_total, ray_cluster=ray_cluster)
  write_outputs(workdir, cfg, run, summary, result)
  return summary, result


def write_outputs(workdir: str, cfg, run: str, summary: dict, result,
                  requests_written: bool = False) -> None:
  """One run's folder: config.json, requests.jsonl, summary.json, report.md, trace.json and
  plots/ (pdjax.run and pdjax.serve write the same; requests_written: pdjax.serve wrote
  requests.jsonl as its requests ended)."""
  from pdjax.metrics import plots
  from pdjax.metrics.report import write_run_files
  from pdjax.metrics.trace import write_chrome_trace
  write_run_files(workdir, config_dict={**cfg.to_dict(), "mode": run},
                  requests=None if requests_written else result.requests, summary=summary)
  os.makedirs(os.path.join(workdir, "plots"), exist_ok=True)
  plots.plot_latency_cdfs({run: result.requests}, os.path.join(workdir, "plots", "latency_cdf.png"))
  plots.plot_tier_timeline(result.steps, result.samples, result.role_switches,
                           os.path.join(workdir, "plots", "tier_timeline.png"))
  full = cfg.get("output", {}).get("trace_steps", "auto") == "full"
  write_chrome_trace(os.path.join(workdir, "trace.json"), requests=result.requests,
                     steps=result.steps, role_switches=result.role_switches,
                     samples=result.samples,
                     **({"max_step_events": None} if full else {}))


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


def run_repeats(cfg, mcfg, workdir: str, params, ray_cluster=None):
  """Every run of the config (mode=compare: colocated, chunked, disaggregated), `repeats`
  times each with seeds seed .. seed+repeats-1 (workload, sampling and faults; the model's
  weights stay those of `seed`). Returns ({run: summary}, {run: [RunResult per repeat]});
  with repeats > 1 a run's summary is the aggregate (metrics.compare.aggregate_repeats),
  written to <run>/summary.json beside <run>/repeat-<k>/."""
  from pdjax.metrics.compare import aggregate_repeats
  runs, n = config_lib.modes(cfg), int(cfg.get("repeats", 1))
  seeds = [cfg.seed + k for k in range(n)]
  per_run = {run: [] for run in runs}
  for k, seed in enumerate(seeds):     # repeat outside: each seed's workload is loaded once
    rep_cfg = cfg
    if k:
      rep_cfg = cfg.copy_and_resolve_references()
      rep_cfg.seed = seed
    for run in runs:
      run_dir = os.path.join(workdir, run) if len(runs) > 1 else workdir
      if n > 1:
        run_dir = os.path.join(run_dir, f"repeat-{k}")
      per_run[run].append(run_mode(rep_cfg, mcfg, run, run_dir, params,
                                   ray_cluster=ray_cluster))
  summaries = {}
  for run, done in per_run.items():
    if n == 1:
      summaries[run] = done[0][0]
      continue
    summaries[run] = aggregate_repeats(run, [s for s, _ in done], seeds)
    run_dir = os.path.join(workdir, run) if len(runs) > 1 else workdir
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
      json.dump(summaries[run], f, indent=2)
  return summaries, {run: [r for _, r in done] for run, done in per_run.items()}


def ray_cluster_for(cfg):
  """A context holding the run's RayCluster (started on entry, stopped on exit) under
  cluster.launcher=ray; holding None otherwise."""
  import contextlib
  if config_lib.launcher(cfg) != "ray":
    return contextlib.nullcontext()
  from pdjax.distributed.launcher import RayCluster
  c = cfg.cluster
  return RayCluster(address=c.ray_address, accelerator=c.ray_accelerator,
                    transfer_host=c.transfer_host, pull_timeout_s=c.pull_timeout_s,
                    compile_cache_dir=os.path.expanduser(cfg.compile_cache_dir),
                    transfer_timeout_s=cfg.kv.transfer_timeout_s)


def write_comparison(workdir: str, summaries: dict, results: dict) -> None:
  """compare.md (what ran, a conclusion, the side-by-side table and, per prompt-length
  bucket, the net benefit of disaggregation against the plain colocated run, pooled over
  repeats) and plots/latency_cdf.png for all runs (first repeat). results: {run: [RunResult
  per repeat]}."""
  from pdjax.metrics import plots
  from pdjax.metrics.benefit import net_benefit_pooled
  from pdjax.metrics.compare import write_compare_report
  benefit = None
  if "colocated" in results and "disaggregated" in results:
    pairs = [(c.requests, d.requests)
             for c, d in zip(results["colocated"], results["disaggregated"])]
    benefit = net_benefit_pooled(pairs, BENEFIT_BUCKETS)
  write_compare_report(os.path.join(workdir, "compare.md"), summaries, benefit)
  os.makedirs(os.path.join(workdir, "plots"), exist_ok=True)
  plots.plot_latency_cdfs({run: r[0].requests for run, r in results.items()},
                          os.path.join(workdir, "plots", "latency_cdf.png"))


BENEFIT_BUCKETS = [0, 64, 128, 256, 512, 1024, 4096]


def entry_point() -> None:
  app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
  entry_point()
