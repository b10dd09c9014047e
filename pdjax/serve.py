"""An OpenAI-compatible HTTP server over the P/D engine.

  python -m pdjax.serve --config=configs/smollm2.py --host=127.0.0.1 --port=8000 \\
      [--config.mode=disaggregated] [--workdir=DIR] [--grace_s=30]

Serves the config's mode (colocated, disaggregated; colocated with
scheduler.colocated_policy=chunked_prefill for chunked prefill; compare, the shipped configs'
default, serves disaggregated) on the same instances, policies
and KV transfer as `pdjax.run`: POST /v1/completions and /v1/chat/completions (streaming or
not), GET /v1/models, /health and /metrics (Prometheus). Two processes, as vLLM's API server and
EngineCore: this one parses, tokenizes and streams over HTTP; the engine-core process
(pdjax/server/engine_core.py, started with spawn) runs the driver and the instances, and
sends each step's tokens back in one message, so the HTTP side never holds the driver's GIL.
SIGINT / SIGTERM: stop admitting (new requests, on the
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
from pdjax.cli import define_config_and_workdir, fail, parse_flags
from pdjax.runner.outputs import default_workdir
from pdjax.server.engine_api import error_text
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
    if cfg.mode == "hybrid":
      raise config_lib.ConfigError("mode='hybrid' is not served yet (pdjax.run runs it); serve "
                                   "colocated, chunked or disaggregated")
  except config_lib.ConfigError as e:
    fail(f"config error: {e}")
  from pdjax.server.engine_client import EngineClient
  from pdjax.server.serve_plan import ServePlan
  from pdjax.text.stops import load_text
  from pdjax.text.tokenizer import TextError

  default = default_workdir(flags.FLAGS["config"].config_filename)
  workdir = WORKDIR.value or os.path.join(os.path.dirname(default),
                                          "serve-" + os.path.basename(default))
  tokenizer = None   # this process's, for the prompts (the engine process loads its own)
  try:
    if cfg.model.checkpoint or cfg.model.tokenizer:
      tokenizer, _, _ = load_text(cfg.model.checkpoint, cfg.model.tokenizer, mcfg)
  except (TextError, KeyError, ValueError) as e:
    fail(f"config error: {e.args[0]}")
  name = _NAME.value or cfg.model.checkpoint or cfg.model.preset
  run = run_name(cfg)
  os.makedirs(workdir, exist_ok=True)
  engine = EngineClient(ServePlan(cfg, mcfg, run, name, workdir), tokenizer=tokenizer)
  try:
    engine.start()     # jax, the devices and the weights, in the engine process
    if engine.config_error is not None:
      fail(f"config error: {engine.config_error}")
    if engine.error is None:
      serve_http(engine, cfg, mcfg, name, run, host=_HOST.value, port=_PORT.value,
                 grace_s=_GRACE.value)
    summary = engine.stop(0.0)   # drained by the server already: no second grace
  finally:
    engine.close(0.0)
  if summary is None:           # the engine process died: requests.jsonl has what ended
    sys.exit(f"the engine stopped: {error_text(engine.error)}")
  if not summary["served"]:     # stopped, or failed, before it was ready: nothing served
    if summary["error"] is not None:
      sys.exit(f"the server failed to start: {summary['error']}")
    print("stopped while starting: nothing was served", flush=True)
    return
  print(f"results: {workdir}", flush=True)
  if summary["error"] is not None:   # written what it could; the crash is an error exit
    sys.exit(f"the engine stopped: {summary['error']}")


def entry_point() -> None:
  app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
  entry_point()
