"""Splits the local devices into named instance sub-meshes and says how arrays shard on them.

Each instance is a 1-D mesh with axis "tp" (tensor parallel). Attention heads, kv heads and the
MLP's intermediate features are split over "tp"; the page pools are split over kv heads, so an
instance's KV lives beside the heads that read it.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from pdjax.models.param_layout import LAYOUTS

TP_AXIS = "tp"


@dataclasses.dataclass(frozen=True)
class InstanceSpec:
  name: str            # e.g. "prefill-0"
  role: str            # "prefill" | "decode" | "colocated"
  devices: tuple       # jax devices, in mesh order


def split_devices(devices, tiers: list[tuple[str, int, int]]) -> list[InstanceSpec]:
  """Assigns consecutive devices to instances: tiers are (role, instances, tp)."""
  needed = sum(n * tp for _, n, tp in tiers)
  if needed > len(devices):
    raise ValueError(f"cluster needs {needed} devices, only {len(devices)} available")
  specs, start = [], 0
  for role, count, tp in tiers:
    for i in range(count):
      specs.append(InstanceSpec(f"{role}-{i}", role, tuple(devices[start:start + tp])))
      start += tp
  return specs


PARAM_LAYOUTS = ("auto",) + LAYOUTS   # model.param_layout


def param_layout(devices, requested: str = "auto") -> str:
  """The parameter layout of an instance on these devices (pdjax/models/param_layout.py;
  model.param_layout). "auto": "unrolled" for a CPU TP1 instance (XLA on CPU copies scanned
  weights out of their stack before each dot: decode steps are faster, compiles ~3x slower),
  "stacked" on TPU, GPU and at TP > 1. "unrolled" needs TP1."""
  if requested not in PARAM_LAYOUTS:
    raise ValueError(f"model.param_layout={requested!r} is not one of {list(PARAM_LAYOUTS)}")
  if requested == "unrolled" and len(devices) > 1:
    raise ValueError(f"model.param_layout='unrolled' needs TP1 instances, not TP{len(devices)}")
  if requested == "auto":
    return "unrolled" if devices[0].platform == "cpu" and len(devices) == 1 else "stacked"
  return requested


def instance_mesh(devices) -> Mesh:
  return Mesh(np.array(devices), (TP_AXIS,))


def kv_pool_spec() -> P:
  """[layers, kv_heads, pages, page_size, head_dim]: kv heads over tp."""
  return P(None, TP_AXIS, None, None, None)


def _param_spec(path: str, ndim: int) -> P:
  """Megatron-style tensor parallel layout for the Llama parameter tree (layers stacked)."""
  if "layers" in path:
    if any(n in path for n in ("q_proj", "k_proj", "v_proj")):
      return P(None, None, TP_AXIS, None)        # [L, hidden, heads, D]
    if "o_proj" in path:
      return P(None, TP_AXIS, None, None)        # [L, heads, D, hidden]
    if any(n in path for n in ("gate_proj", "up_proj")):
      return P(None, None, TP_AXIS)              # [L, hidden, I]
    if "down_proj" in path:
      return P(None, TP_AXIS, None)              # [L, I, hidden]
  return P(*([None] * ndim))                     # embeddings, norms, lm_head: replicated


def param_shardings(mesh: Mesh, params):
  def spec(path, leaf):
    return NamedSharding(mesh, _param_spec(jax.tree_util.keystr(path), np.ndim(leaf)))
  return jax.tree_util.tree_map_with_path(spec, params)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def step_shardings(mesh: Mesh, param_sh) -> tuple[tuple, tuple]:
  """(in, out) shardings of a step program (params, kv, packed batch, previous tokens) ->
  (tokens, kv): params by `param_shardings`, KV pools by kv heads, the rest replicated. `mesh`
  may be an AbstractMesh (ahead-of-time export without the devices)."""
  kv = (NamedSharding(mesh, kv_pool_spec()),) * 2
  rep = replicated(mesh)
  return (param_sh, kv, rep, rep), (rep, kv)
