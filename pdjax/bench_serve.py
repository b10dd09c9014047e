"""A benchmark client for OpenAI-compatible servers, like `vllm bench serve`.

  python -m pdjax.bench_serve --base_url=http://127.0.0.1:8000 --config=configs/default.py:smoke \
      --config.workload.num_requests=32 --output=result.json [--model=NAME] [--endpoint=chat]
      [--max_concurrency=N]

Loads the config's workload (workload, seed, slo, sampling.temperature, kv.max_model_len and the
model's vocab size; nothing else is read) exactly as pdjax.run does, replays its arrivals on the
wall clock (request i is sent arrival_s after the start) as streaming requests, one task each,
and measures TTFT, TPOT, ITL and E2E latency from the client side. Prints a table and writes the
result JSON (vllm's keys; latencies in the lists are seconds, in the aggregates milliseconds).
Host logic only: no jax import.
"""

from __future__ import annotations

import functools
import json
import os
import sys

import httpx
from absl import app, flags, logging
from ml_collections import config_flags

from pdjax import config as config_lib
from pdjax.cli import describe_config_flag_error, fail, first_and_last_line, parse_flags
from pdjax.client.bench import (ENDPOINTS, default_model, format_table, load_requests,
                                run_benchmark)

_DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs",
                               "default.py")


def define_flags() -> dict:
  """Defines the command line's flags; called by entry_point only, so importing this module
  defines no absl flag (pdjax.run's --config may be defined in the same process)."""
  try:   # config_flags loads the file and applies --config.* overrides right here
    config = config_flags.DEFINE_config_file(
        "config", _DEFAULT_CONFIG, "Config file; only its workload part is used.",
        lock_config=True)
  except Exception as e:  # pylint: disable=broad-except
    fail(describe_config_flag_error(e, sys.argv))
  return dict(
      config=config,
      base_url=flags.DEFINE_string("base_url", "http://127.0.0.1:8000", "Server address."),
      output=flags.DEFINE_string("output", None, "Write the result JSON here."),
      model=flags.DEFINE_string("model", None, "Model name (default: GET /v1/models' first)."),
      endpoint=flags.DEFINE_enum("endpoint", "completions", list(ENDPOINTS), "API to call."),
      max_concurrency=flags.DEFINE_integer(
          "max_concurrency", 0, "At most this many requests in flight (0: no limit); a request "
          "due while all are busy is sent when one ends (with a rate far above what the server "
          "sustains, a closed loop of N clients).", lower_bound=0))


def main(argv, holders: dict) -> None:
  if len(argv) > 1:
    fail(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)   # not httpx's line per request
  try:
    cfg = holders["config"].value
    cfg.workload  # a config file that failed to load raises here, on first use
  except OSError as e:
    fail(f"config error: cannot load --config: {first_and_last_line(str(e))}")
  try:
    requests, problems = load_requests(cfg)
  except (config_lib.ConfigError, ValueError) as e:
    fail(f"config error: {e}")
  for line in problems:
    print(f"workload: {line}", file=sys.stderr)
  base_url = holders["base_url"].value
  try:
    model = holders["model"].value or default_model(base_url)
  except (httpx.HTTPError, ValueError, KeyError, IndexError) as e:
    fail(f"cannot list models at {base_url}/v1/models: {type(e).__name__}: {e}", code=1)
  result = run_benchmark(base_url, requests, model=model, endpoint=holders["endpoint"].value,
                         temperature=cfg.sampling.temperature, slo_ttft_s=cfg.slo.ttft_s,
                         slo_tpot_s=cfg.slo.tpot_s,
                         max_concurrency=holders["max_concurrency"].value)
  print(format_table(result))
  if holders["output"].value:
    with open(holders["output"].value, "w") as f:
      json.dump(result, f, indent=1)
    print(f"result: {holders['output'].value}")


def entry_point() -> None:
  holders = define_flags()
  app.run(functools.partial(main, holders=holders), flags_parser=parse_flags)


if __name__ == "__main__":
  entry_point()
