"""Lowers the engine's own programs for TPU and GPU ahead of time, from any host (no devices).

  python -m pdjax.lower_check                          # Llama-3-8B and SmolLM2-135M, tpu + cuda
  python -m pdjax.lower_check --config=configs/smollm2.py --targets=tpu
  python -m pdjax.lower_check --models=llama3_8b --programs=decode --kernels=none
  python -m pdjax.lower_check --config=configs/default.py --config.cluster.decode.tp=4 \
      --config.cluster.decode.hosts=2                  # a decode instance over 2 hosts x 2 chips

Prefill, decode (with the Pallas attention), and the KV transfer's gather and scatter, built as
an instance builds them and exported with `jax.export` for each target on an AbstractMesh of
the instance's TP (see pdjax.engine.program_export for what makes a case ok). Built-in shapes
(--models): llama3_8b (bfloat16, 8k context, TP 1 and 8) and smollm2_135m (as configs/smollm2.py
serves it, TP 1 and 3); --config lowers a run config's model, buckets and tier TPs instead,
each tier over its cluster.<tier>.hosts: a multi-host instance is one SPMD program over all its
hosts' devices (num_partitions = TP), and its lines name the layout ("2 hosts x 2 chips").
--kernels also runs the kernel grid (`python -m kernels_pallas.lower_check`): its --fast subset
by default. One line per case, then what is not exported and why, then a summary; exit status
1 when a case fails, 2 on a bad flag or config.
"""

from __future__ import annotations

import os
import sys
import time

from absl import app, flags, logging
from ml_collections import config_flags

from pdjax.cli import describe_config_flag_error, fail, parse_flags

try:
  CONFIG = config_flags.DEFINE_config_file("config", None, "A run config whose model, engine "
                                           "buckets and tier TPs to lower (instead of "
                                           "--models).", lock_config=True)
except Exception as e:  # pylint: disable=broad-except
  fail(describe_config_flag_error(e, sys.argv))
MODELS = flags.DEFINE_list("models", ["llama3_8b", "smollm2_135m"],
                           "Built-in model shapes to lower: llama3_8b, smollm2_135m.")
TARGETS = flags.DEFINE_list("targets", ["tpu", "cuda"], "Export platforms: tpu, cuda.")
PROGRAMS = flags.DEFINE_list("programs", ["prefill", "decode", "gather", "scatter"],
                             "Engine programs to lower.")
KERNELS = flags.DEFINE_enum("kernels", "fast", ["none", "fast", "full"],
                            "Also lower the Pallas kernel grid (kernels_pallas.lower_check): "
                            "its --fast subset, the full grid, or none.")


def _check_names(flag, allowed) -> None:
  bad = [v for v in flag.value if v not in allowed]
  if bad or not flag.value:
    fail(f"--{flag.name}: expected a comma list of {list(allowed)}, got {','.join(flag.value)!r}")


def main(argv) -> int:
  if len(argv) > 1:
    fail(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  import jax
  from kernels_pallas import lower_check as kernel_check
  from pdjax.config import ConfigError
  from pdjax.engine import program_export
  _check_names(TARGETS, program_export.TARGETS)
  _check_names(PROGRAMS, program_export.PROGRAMS)
  if CONFIG.value is not None:
    try:
      name = os.path.basename(config_flags.get_config_filename(flags.FLAGS["config"]))
      models = [program_export.shape_from_config(CONFIG.value, name)]
    except ConfigError as e:
      fail(f"config error: {e}")
  else:
    _check_names(MODELS, program_export.BUILTIN)
    models = [program_export.BUILTIN[m] for m in MODELS.value]
  start = time.perf_counter()
  failed = lowered = 0
  for case in program_export.cases(models, tuple(TARGETS.value), tuple(PROGRAMS.value)):
    result = program_export.lower(case)
    print(result.line(), flush=True)
    lowered += result.ok
    failed += not result.ok
  for line in program_export.NOT_EXPORTED:
    print(f"not exported: {line}")
  print(f"engine programs: {lowered} lowered, {failed} failed ({lowered + failed} cases, "
        f"jax {jax.__version__}, host {jax.default_backend()}, "
        f"{time.perf_counter() - start:.0f}s)")
  if KERNELS.value != "none":
    targets = tuple(t for t in kernel_check.TARGETS if t in TARGETS.value)
    kernel_failed = kernel_check.run(kernel_check.grid(targets, kernel_check.KERNELS,
                                                       fast=KERNELS.value == "fast"),
                                   label="kernels: ")
    failed += kernel_failed
  return 1 if failed else 0


def entry_point() -> None:
  app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
  entry_point()
