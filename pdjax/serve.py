"""An OpenAI-compatible HTTP server over the P/D engine.

  python -m pdjax.serve --config=configs/smollm2.py --host=127.0.0.1 --port=8000 \\
      [--config.mode=disaggregated] [--workdir=DIR] [--grace_s=30]

Serves the config's mode (colocated, disaggregated; colocated with
scheduler.colocated_policy=chunked_prefill for chunked prefill; compare, the shipped configs'
default, serves disaggregated) on the same instances, policies
and KV transfer as `pdjax.run`: POST /v1/completions and /v1/chat/completions (streaming or
not), GET /v1/models, /health and /metrics (Prometheus). The driver runs on the wall clock in
its own thread (pdjax/server/driver_bridge.py). SIGINT / SIGTERM: stop admitting (new requests, on the
socket kept open until the drain ends, get 503 with Retry-After), let requests in flight finish
for --grace_s, cancel the rest (streams end with finish_reason "abort" and [DONE], whole answers
with what they have; a second signal cancels at once), then write the run's
requests.jsonl, summary.json, report.md, trace.json and plots/ into --workdir as `pdjax.run`
does, and check the end-of-run invariants (every request terminal, every page back).
"""

from __future__ import annotations

import os
import sys

from absl import app, flags, logging

from pdjax import config as config_lib
from pdjax.cli import define_config_and_workdir, fail, parse_flags, use_cpu_devices
from pdjax.runner.build import ray_cluster_for
from pdjax.runner.execute import run_info_of, summarize_run
from pdjax.runner.outputs import default_workdir, write_outputs
from pdjax.server.http_server import limit_malloc_arenas, run_name, serve_http

CONFIG, WORKDIR = define_config_and_workdir()   # as pdjax.run's

_HOST = flags.DEFINE_string("host", "127.0.0.1", "Address to listen on.")
_PORT = flags.DEFINE_integer("port", 8000, "Port to listen on.")
_GRACE = flags.DEFINE_float("grace_s", 30.0, "On shutdown, how long requests in flight may "
                            "still finish before they are cancelled.")
_NAME = flags.DEFINE_string("served_model_name", "", "The model id clients name; default: "
                            "model.checkpoint, else the preset name.")


def main(argv) -> None:
  if len(argv) > 1:
    fail(f"unexpected arguments: {' '.join(argv[1:])}")
  limit_malloc_arenas()
  logging.set_verbosity(logging.WARNING)
  try:
    cfg = CONFIG.value
    cfg.mode  # a config file that failed to load raises here, on first use
  except OSError as e:
    fail(f"config error: cannot load --config: {e}")
  try:
    mcfg = config_lib.validate(cfg)
    if cfg.backend != "jax":
      raise config_lib.ConfigError(f"backend={cfg.backend!r}: the server needs the real engine "
                                   "(backend='jax')")
    use_cpu_devices(cfg.num_cpu_devices)
    import jax
    config_lib.validate(cfg, device_count=jax.device_count())
  except config_lib.ConfigError as e:
    fail(f"config error: {e}")
  from pdjax.engine.cluster import enable_compile_cache, host_params
  from pdjax.text.stops import load_text
  from pdjax.text.tokenizer import TextError

  enable_compile_cache(cfg.compile_cache_dir)
  default = default_workdir(flags.FLAGS["config"].config_filename)
  workdir = WORKDIR.value or os.path.join(os.path.dirname(default),
                                          "serve-" + os.path.basename(default))
  from pdjax.server.startup import Startup
  startup = Startup()
  tokenizer, stop_ids = None, tuple(mcfg.eos_token_ids)
  try:
    if cfg.model.checkpoint or cfg.model.tokenizer:
      tokenizer, _, stop_ids = load_text(cfg.model.checkpoint, cfg.model.tokenizer, mcfg)
    params = None
    if config_lib.launcher(cfg) == "local" or cfg.debug:
      startup.begin("loading weights", cfg.model.checkpoint or
                    f"random {cfg.model.preset} weights, seed {cfg.seed}")
      params = host_params(mcfg, checkpoint=cfg.model.checkpoint, seed=cfg.seed,
                           dtype=cfg.model.dtype)
      startup.end()
  except (TextError, KeyError, ValueError) as e:
    fail(f"config error: {e.args[0]}")
  name = _NAME.value or cfg.model.checkpoint or cfg.model.preset
  run = run_name(cfg)
  os.makedirs(workdir, exist_ok=True)
  with ray_cluster_for(cfg) as ray_cluster:
    engine = serve_http(cfg, mcfg, run, params, ray_cluster, tokenizer, stop_ids, name, workdir,
                      startup, host=_HOST.value, port=_PORT.value, grace_s=_GRACE.value)
    if engine.driver is None:    # stopped, or failed, before it was ready: nothing served
      engine.close()
      if engine.error is not None:
        sys.exit(f"the server failed to start: {type(engine.error).__name__}: {engine.error}")
      print("stopped while starting: nothing was served", flush=True)
      return
    result, error = engine.result, engine.error
    summary = summarize_run(cfg, run, result, result.instances or engine.instances)
    summary["run_info"] = run_info_of(cfg, mcfg, run, workload={
        "kind": "http", "requests": len(result.requests)})
  write_outputs(workdir, cfg, run, summary, result, requests_written=True)
  engine.close()
  print(f"results: {workdir}", flush=True)
  if error is not None:   # written what it could; the crash is an error exit
    sys.exit(f"the engine stopped: {type(error).__name__}: {error}")


def entry_point() -> None:
  app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
  entry_point()
