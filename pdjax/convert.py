"""Converts a local Hugging Face checkpoint into a pdjax orbax checkpoint.

  python -m pdjax.convert --checkpoint=HF_FOLDER --out=DIR [--dtype=bfloat16]

DIR gets params/ (orbax, pdjax's parameter layout), the config, generation config and tokenizer
files, and pdjax_checkpoint.json; `model.checkpoint=DIR` then restores each instance's shards
straight onto its devices. Tensors keep the checkpoint's dtype unless --dtype says otherwise
(a run casts to its model.dtype as it reads). Storage is chunked per layer and along the
tensor-parallel axis as a TP=`storage_tp` instance shards it, so an instance whose TP divides
storage_tp reads exactly its own shards. Converting holds the model on the host twice (the
loaded tree and its CPU-device copy being written).
"""

from __future__ import annotations

import glob
import os

from absl import app, flags, logging

from pdjax.cli import fail, parse_flags, use_cpu_devices
from pdjax.models import orbax_checkpoint as ocp_lib
from pdjax.engine.hf_to_orbax import MAX_CPU_DEVICES, convert, max_tp
from pdjax.models.llama_config import config_from_hf

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Local HF checkpoint folder.")
_OUT = flags.DEFINE_string("out", None, "Output folder (new or empty).")
_DTYPE = flags.DEFINE_enum("dtype", "", ["", "float32", "bfloat16", "float16"],
                           "Stored dtype; empty: the checkpoint's own.")

def main(argv) -> None:
  if len(argv) > 1:
    fail(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  for name, flag in (("checkpoint", _CHECKPOINT), ("out", _OUT)):
    if not flag.value:
      fail(f"convert: --{name} is required")
  try:
    ocp_lib.checkpoint_format(_CHECKPOINT.value)
    mcfg = config_from_hf(_CHECKPOINT.value)
  except (ValueError, KeyError, FileNotFoundError) as e:
    fail(f"convert: {str(e).removeprefix('model.checkpoint: ')}")
  use_cpu_devices(min(max_tp(mcfg), MAX_CPU_DEVICES))   # before jax starts
  try:
    marker = convert(_CHECKPOINT.value, _OUT.value, _DTYPE.value)
  except ValueError as e:
    fail(str(e))
  size = sum(os.path.getsize(p) for p in glob.glob(os.path.join(_OUT.value, "params", "**"),
                                                     recursive=True) if os.path.isfile(p))
  print(f"wrote {_OUT.value}: {len(marker['tensors'])} tensors, {marker['dtype']}, "
        f"{size / 2**20:.1f} MiB, storage_tp={marker['storage_tp']}, "
        f"copied {', '.join(marker['copied'])}")


def entry_point() -> None:
  app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
  entry_point()
