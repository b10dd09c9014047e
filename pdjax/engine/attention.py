"""Which attention implementation an engine instance runs, bound to its mesh.

The attention math lives below the engine and the models, in kernels_pallas: the XLA path
(`kernels_pallas.xla_attention`), the Pallas kernels, and `AttentionOps`, the selector the
model calls. Here only the per-instance decision: "auto" resolved by backend, plus the mesh.
"""

from __future__ import annotations

import jax
from jax.sharding import Mesh

from kernels_pallas.attention_ops import AttentionOps

ATTENTION_IMPLS = ("auto", "pallas", "xla")


def resolve_impl(attention_impl: str, mesh: Mesh | None = None) -> AttentionOps:
  """"auto": Pallas on TPU/GPU, XLA on CPU. "pallas" on CPU runs in interpret mode."""
  if attention_impl not in ATTENTION_IMPLS:
    raise ValueError(f"model.attention_impl={attention_impl!r} is not one of "
                     f"{list(ATTENTION_IMPLS)}")
  on_accelerator = jax.default_backend() in ("tpu", "gpu", "cuda", "rocm")
  impl = attention_impl if attention_impl != "auto" else ("pallas" if on_accelerator else "xla")
  # only the Pallas kernels need the mesh (shard_map); without it, instances on other
  # devices share one traced step program (programs.step_function)
  return AttentionOps(impl=impl, mesh=mesh if impl == "pallas" else None,
                      interpret=impl == "pallas" and not on_accelerator)
