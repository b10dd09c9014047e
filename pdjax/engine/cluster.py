"""Builds the instances of one serving mode on the local devices and compiles their programs."""

from __future__ import annotations

import os

import jax
import numpy as np

from pdjax.engine import mesh as mesh_lib
from pdjax.engine import transfer
from pdjax.engine.instance import EngineOptions, Instance
from pdjax.models.llama import init_params
from pdjax.models.llama_config import LlamaConfig


def enable_compile_cache(path: str) -> None:
  """JAX's persistent compilation cache: identical programs (same model, bucket and TP, on any
  devices) compile once per machine, not once per instance and run. Empty path: off."""
  if not path:
    return
  jax.config.update("jax_compilation_cache_dir", os.path.expanduser(path))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def host_params(mcfg: LlamaConfig, *, checkpoint: str, seed: int, dtype: str):
  """Parameters as host numpy arrays: loaded from a local HF checkpoint, or seeded random."""
  np_dtype = jax.numpy.dtype(dtype)
  if checkpoint:
    from pdjax.models.hf_loader import load_hf_checkpoint
    return load_hf_checkpoint(checkpoint, dtype=np_dtype)[1]
  params = init_params(mcfg, seed, dtype=np_dtype)
  return jax.tree_util.tree_map(np.asarray, params)


def build_instances(tiers: list[tuple[str, int, int]], mcfg: LlamaConfig, params,
                    opts: EngineOptions, devices=None) -> list[Instance]:
  """One Instance per (role, index), each warmed up with the programs its role runs."""
  specs = mesh_lib.split_devices(devices or jax.devices(), tiers)
  decode_tps = tuple(sorted({tp for role, _, tp in tiers if role == "decode"}))
  instances = []
  for spec in specs:
    inst = Instance(spec, mcfg, params, opts)
    inst.warm_up(prefill=spec.role in ("prefill", "colocated"),
                 decode=spec.role in ("decode", "colocated"),
                 transfer_to_tp=decode_tps if spec.role == "prefill" else (),
                 receive=spec.role == "decode")
    instances.append(inst)
  for src in (i for i in instances if i.role == "prefill"):
    for dst in (i for i in instances if i.role == "decode"):
      transfer.warm_up_transfers(src, dst)
  return instances
