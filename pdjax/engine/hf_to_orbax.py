"""HF checkpoint -> pdjax orbax checkpoint, the library half of `python -m pdjax.convert`
(flag-free, so tests and tools can import it beside other entry points).

The output folder gets params/ (orbax, pdjax's parameter layout), the config, generation config
and tokenizer files, and pdjax_checkpoint.json. Tensors keep the checkpoint's dtype unless
`dtype` says otherwise (a run casts to its model.dtype as it reads). Storage is chunked per
layer and along the tensor-parallel axis as a TP=`storage_tp` instance shards it, so an
instance whose TP divides storage_tp reads exactly its own shards. Converting holds the model
on the host twice (the loaded tree and its CPU-device copy being written).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import shutil

from pdjax.models import orbax_checkpoint as ocp_lib
from pdjax.models.llama_config import LlamaConfig, config_from_hf


# Copied next to params/ so the folder is a self-contained model (tokenizer included).
COPIED = ("config.json", "generation_config.json", "tokenizer*", "special_tokens_map.json",
          "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt", "chat_template*",
          "*.model", "*.tiktoken")
_SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
MAX_CPU_DEVICES = 16


def safetensors_dtype(checkpoint: str) -> str:
  """The checkpoint's tensor dtype, read from the safetensors headers; float32 when mixed."""
  found = set()
  for path in glob.glob(os.path.join(checkpoint, "*.safetensors")):
    with open(path, "rb") as f:
      header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    found |= {v["dtype"] for k, v in header.items() if k != "__metadata__"}
  return _SAFETENSORS_DTYPES.get(found.pop(), "float32") if len(found) == 1 else "float32"


def max_tp(mcfg: LlamaConfig) -> int:
  """Every TP a run accepts divides this (config validation: tp | heads, kv heads, MLP)."""
  return math.gcd(mcfg.num_heads, mcfg.num_kv_heads, mcfg.intermediate_size)


def convert(checkpoint: str, out: str, dtype: str = "") -> dict:
  """Writes the pdjax orbax checkpoint of HF folder `checkpoint` into `out`; returns the
  marker. Raises ValueError (one line) for a bad input or a non-empty `out`."""
  if ocp_lib.checkpoint_format(checkpoint) != "hf":
    raise ValueError(f"convert: {checkpoint} is already a pdjax orbax checkpoint")
  if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
    raise ValueError(f"convert: --out={out} exists and is not an empty folder")
  mcfg = config_from_hf(checkpoint)
  import jax
  import jax.numpy as jnp
  import orbax.checkpoint as ocp
  from pdjax.engine import mesh as mesh_lib
  from pdjax.models.hf_loader import load_hf_checkpoint

  stored = dtype or safetensors_dtype(checkpoint)
  _, params = load_hf_checkpoint(checkpoint, dtype=jnp.dtype(stored))
  cpus = jax.devices("cpu")
  tp = max(d for d in range(1, len(cpus) + 1) if max_tp(mcfg) % d == 0)
  shardings = mesh_lib.param_shardings(mesh_lib.instance_mesh(cpus[:tp]), params)
  # Per-layer chunks (stacked layers split on axis 0); each TP shard is its own chunk.
  save_args = jax.tree_util.tree_map_with_path(
      lambda path, x: ocp.SaveArgs(shard_axes=(0,) if "layers" in jax.tree_util.keystr(path)
                                   else ()), params)
  tensors = ocp_lib.tensor_shapes(params)
  arrays = jax.device_put(params, shardings)
  del params
  os.makedirs(out, exist_ok=True)
  # Uncompressed: loads are CPU-bound on decompression otherwise (~1.4x slower measured).
  with ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_compression=False)) as ckpt:
    ckpt.save(os.path.join(os.path.abspath(out), ocp_lib.PARAMS_DIR),
              args=ocp.args.PyTreeSave(arrays, save_args=save_args))
  del arrays
  copied = sorted({os.path.basename(p) for pattern in COPIED
                   for p in glob.glob(os.path.join(checkpoint, pattern)) if os.path.isfile(p)})
  for name in copied:
    shutil.copyfile(os.path.join(checkpoint, name), os.path.join(out, name))
  marker = {"format": ocp_lib.FORMAT, "version": ocp_lib.VERSION, "dtype": stored,
            "storage_tp": tp, "source": os.path.abspath(checkpoint), "copied": copied,
            "model": dataclasses.asdict(mcfg), "tensors": tensors}
  with open(os.path.join(out, ocp_lib.MARKER), "w") as f:   # last: its presence = complete
    json.dump(marker, f, indent=1)
  return marker
