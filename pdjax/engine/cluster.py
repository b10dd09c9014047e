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
  """JAX's persistent compilation cache: identical programs compile once per machine, not once
  per run. On CPU and TPU the key holds the device assignment (jax strips it on GPU only), so
  instances on other devices compile their own. Empty path: off."""
  if not path:
    return
  jax.config.update("jax_compilation_cache_dir", os.path.expanduser(path))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def host_params(mcfg: LlamaConfig, *, checkpoint: str, seed: int, dtype: str):
  """The run's parameters, in `dtype` (model.dtype), for build_instances: seeded random or a
  local HF checkpoint as host numpy arrays (loaded whole once per process and shared: each
  instance device_puts its shards out of them), or, for a pdjax orbax checkpoint
  (`python -m pdjax.convert`), an OrbaxParams that each instance calls with its shardings to
  read only its own shards, with no host copy of the model. `as_host` turns either into host
  arrays where a host-side reference needs them."""
  np_dtype = jax.numpy.dtype(dtype)
  if checkpoint:
    from pdjax.models import orbax_checkpoint
    if orbax_checkpoint.checkpoint_format(checkpoint) == "orbax":
      return orbax_checkpoint.OrbaxParams(checkpoint, np_dtype)
    from pdjax.models.hf_loader import load_hf_checkpoint
    return load_hf_checkpoint(checkpoint, dtype=np_dtype)[1]
  params = init_params(mcfg, seed, dtype=np_dtype)
  return jax.tree_util.tree_map(np.asarray, params)


def as_host(params):
  """Host numpy params from what host_params returned (an OrbaxParams is read whole)."""
  return params.host() if callable(params) else params


def build_instances(tiers: list[tuple[str, int, int]], mcfg: LlamaConfig, params,
                    opts: EngineOptions, devices=None, *, roles_may_change: bool = False,
                    opts_by_role: dict | None = None, progress=None) -> list[Instance]:
  """One Instance per (role, index), warmed up with every program it may run.

  Every instance gets both step programs (a decode instance prefills to recompute a preempted
  sequence or to serve a short prompt locally; a prefill instance decodes colocated-path
  requests). KV transfer programs go where KV can leave (prefill) and arrive (decode), or
  everywhere when roles may change at run time. Later runs on the same devices load their
  programs from the persistent cache (Instance.compiles_from_cache).
  progress(done, total, what): called after each program compiled (and each transfer route
  warmed up), `total` counted up front.
  """
  specs = mesh_lib.split_devices(devices or jax.devices(), tiers)
  tps = {role: tuple(sorted({tp for r, _, tp in tiers if r == role or roles_may_change}))
         for role in ("prefill", "decode")}
  plans = []
  for spec in specs:
    sends = spec.role == "prefill" or (roles_may_change and spec.role == "decode")
    receives = spec.role == "decode" or (roles_may_change and spec.role == "prefill")
    plans.append((spec, (opts_by_role or {}).get(spec.role, opts),
                  dict(prefill=True, decode=True, transfer_to_tp=tps["decode"] if sends else (),
                       receive=receives)))
  sends = [bool(w["transfer_to_tp"] and o.transfer_buckets) for _, o, w in plans]
  takes = [bool(w["receive"] and o.transfer_buckets) for _, o, w in plans]
  routes = sum(a and b for i, a in enumerate(sends) for j, b in enumerate(takes) if i != j)
  total = sum(Instance.warm_up_programs(o, **w) for _, o, w in plans) + routes
  done = [0]

  def one(what: str) -> None:
    done[0] += 1
    if progress is not None:
      progress(done[0], total, what)

  instances = []
  for spec, inst_opts, warm in plans:   # one instance lowers while the last one compiles
    inst = Instance(spec, mcfg, params, inst_opts)
    inst.warm_up(**warm, on_program=one, wait=False)
    instances.append(inst)
  for inst in instances:
    inst.finish_compiles()
  for src in instances:
    for dst in instances:
      if src is not dst and src._gather and dst._scatter:
        transfer.warm_up_transfers(src, dst)
        one(f"KV route {src.name} -> {dst.name}")
  return instances
