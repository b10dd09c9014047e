"""One run end to end: its instances built, the config's workload loaded (once for all the
runs that serve it), served, and summarized (summary.json's fields). `execute` writes nothing;
`run_mode` also writes the run's folder (outputs.write_outputs)."""

from __future__ import annotations

import json
import os
import sys

from pdjax import config as config_lib
from pdjax.runner.build import build_run
from pdjax.runner.outputs import write_outputs


def summarize_run(cfg, run: str, result, instances, problems=()) -> dict:
  """summary.json of a served run."""
  from pdjax.runner import serve_requests
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
                      kv_pages_leaked=serve_requests.kv_pages_leaked(instances))
  summary.update(summarize_extras(result.requests, duration_s=duration, steps=result.steps,
                                  samples=result.samples, role_switches=result.role_switches,
                                  remesh_events=result.remesh_events))
  summary["kv_cache"] = kv_cache_summary(result.requests, instances, samples=result.samples,
                                         flushes=result.flushes)
  if summary["kv_cache"]["enabled"]:   # (the prefix cache on: the driver kept an audit)
    from pdjax.metrics.kv_layer import cross_node_transfer_bytes, kv_layer_summary
    summary["kv_layer"] = kv_layer_summary(
        result.kv_audit, [i.tables.cache for i in instances if i.tables.cache is not None],
        summary["kv_cache"]["internal_fragmentation"],
        cross_node_transfer_bytes(result.requests, instances))
  summary["faults"] = fault_summary(result.requests, result.faults)
  summary["steps"] = result.step_counts()
  if run == "hybrid":   # (per kind of instance: metrics/hybrid.py)
    from pdjax.metrics.hybrid import hybrid_summary
    summary["hybrid"] = hybrid_summary(
        result.requests, result.transfers, result.steps,
        {kind: (cfg.cluster[kind].instances, cfg.cluster[kind].chunk_budget)
         for kind in ("p_heavy", "d_heavy")})
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
            on_loaded=None, ray_cluster=None, summarize: bool = True):
  """Builds the run's instances (real or simulated), serves the workload; returns (summary,
  RunResult, instances); summary None with summarize=False (the planner reads the requests
  only). Writes nothing. on_loaded(n) is called with the number of requests
  the workload loaded, before serving (a trace may hold fewer than workload.num_requests).
  ray_cluster: a started `distributed.launcher.RayCluster` (cluster.launcher=ray): each
  instance is an actor in its own process, stopped when the run's summary is taken."""
  from pdjax.runner import serve_requests
  from pdjax.runner.hybrid import run_config
  from pdjax.workload.loader import load_workload

  cfg = run_config(cfg, run)   # (hybrid: its P-heavy and D-heavy tiers as prefill and decode)
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
  result = serve_requests.serve(mode, instances, requests, on_progress=on_progress,
                                **serve_kwargs)
  if cfg.debug and cfg.backend == "jax":
    from pdjax.engine.cluster import as_host   # an orbax checkpoint is read whole only here
    serve_requests.check_outputs_alone(result.requests, mcfg, as_host(host_params),
                                       dtype=cfg.model.dtype)
  summary = None
  if summarize:
    summary = summarize_run(cfg, run, result, result.instances or instances, problems)
    summary["run_info"] = run_info_of(cfg, mcfg, run, requests=len(requests))
    if cfg.backend != "sim":   # (the simulator's outputs are deterministic, byte for byte)
      from pdjax.metrics.process import process_footprint
      summary["process"] = process_footprint()   # after the run: a command must not grow
  if ray_cluster is not None:
    ray_cluster.release(instances)   # their processes end; the next run starts its own
    ray_cluster.clear_store()        # (and its own host tier)
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
  result.instances = []   # (summarized: the instances are the pool's, or released now)
  write_outputs(workdir, cfg, run, summary, result)
  return summary, result
