"""Measures the real engine's step times and fits the simulator's calibrated cost model.

  python -m pdjax.calibrate                                  # configs/default.py, this machine
  python -m pdjax.calibrate --config=my.py --out=h200_llama8b.json --repeats=7

Builds the config's disaggregated cluster (or, when it does not fit the devices, one prefill
and one decode instance; plus a colocated one when its TP differs), warms every program, then
times, per TP degree, a grid of prefill steps (each token bucket half and fully used, as one
sequence, as several, and after a cached prefix), decode steps (each batch bucket half and
full, at short, middle and full contexts) and KV transfers (every transfer bucket), and how
instances that share the host slow each other (`measure_sharing`); prefill steps also in a
chunked run's ragged program (a row per decode: more rows, slower small steps) when it
differs. A point is the median of at least --repeats runs (and 50 ms) from dispatch to result,
as the driver sees a step; the whole grid is measured --rounds times, spread in time, and each
point keeps its median over the rounds (on this shared 2-core machine a single pass can be 2x
off). Then it serves a small
workload on the instances for the driver's per-step host time that those step times miss
(`measure_host`). The measuring is `pdjax.engine.step_timing`'s and pdjax/runner/calibration.py's, the fits
`pdjax.sim.calibrated`'s; the JSON keeps the merged points and each
fit's mean relative error. On a GPU or TPU the same command profiles that hardware.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from pdjax import config as config_lib
from pdjax.cli import (describe_config_flag_error, fail, first_and_last_line, parse_flags,
                       use_cpu_devices)
from pdjax.engine.step_timing import MIN_POINT_S

_DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs",
                               "default.py")   # shipped with the package
try:
  CONFIG = config_flags.DEFINE_config_file("config", _DEFAULT_CONFIG,
                                            "Config whose model, engine and TP to calibrate.",
                                            lock_config=True)
except Exception as e:  # pylint: disable=broad-except
  fail(describe_config_flag_error(e, sys.argv))
OUT = flags.DEFINE_string("out", None, "Profile JSON to write (default "
                          "profiles/<backend>_<model>_<dtype>.json).")
REPEATS = flags.DEFINE_integer("repeats", 5, "Timed runs per grid point and round (at least "
                               f"this many and {MIN_POINT_S} s; median kept).")
ROUNDS = flags.DEFINE_integer("rounds", 3, "Passes over the whole grid, spread in time; each "
                              "point keeps its median over the rounds (a shared machine's "
                              "speed drifts).")


def main(argv) -> None:
  if len(argv) > 1:
    fail(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  try:
    cfg = CONFIG.value
    cfg.mode
  except OSError as e:
    fail(f"config error: cannot load --config: {first_and_last_line(str(e))}")
  if REPEATS.value < 1 or ROUNDS.value < 1:
    fail(f"config error: --repeats={REPEATS.value} and --rounds={ROUNDS.value} must be >= 1")
  try:
    mcfg = config_lib.validate(cfg)
    use_cpu_devices(cfg.num_cpu_devices)
    import jax
    c = cfg.cluster
    need = c.prefill.tp + c.decode.tp + (0 if c.colocated.tp in (c.prefill.tp, c.decode.tp)
                                         else c.colocated.tp)
    if need > jax.device_count():
      raise config_lib.ConfigError(f"calibration needs {need} devices (one instance per TP "
                                   f"degree), only {jax.device_count()} available")
  except config_lib.ConfigError as e:
    fail(f"config error: {e}")
  from pdjax.engine.cluster import enable_compile_cache
  from pdjax.runner.calibration import calibrate
  from pdjax.sim.calibrated import save_profile
  enable_compile_cache(cfg.compile_cache_dir)
  profile = calibrate(cfg, mcfg, REPEATS.value, ROUNDS.value)
  out = OUT.value or os.path.join(
      "profiles", f"{profile['hardware']['backend']}_{os.path.basename(profile['model_name'])}"
                  f"_{cfg.model.dtype}.json")
  os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
  save_profile(out, profile)
  print(f"host sharing (slowdown by [other prefills][other decodes]): {profile['host_sharing']}")
  print("host time per step: " + ", ".join(
      f"{k} {1e3 * h['base_s']:.3f} ms + {1e3 * h['per_seq_s']:.3f} ms/row "
      f"(x{h['waited_share']:.2f} waited; {h['steps']} steps)"
      for k, h in profile["host_s"].items()))
  for tp, fits in profile["instances"].items():
    ragged = (f"prefill (ragged program) {fits['prefill_ragged']}, "
              if "prefill_ragged" in fits else "")
    print(f"tp={tp}: prefill {fits['prefill']}, {ragged}decode {fits['decode']}, "
          f"transfer {fits['transfer']}; mean relative error {fits['mean_rel_error']}")
  print(f"profile: {out}")


def entry_point() -> None:
  app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
  entry_point()
