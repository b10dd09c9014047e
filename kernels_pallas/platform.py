"""Which kernel variant runs: TPU (Mosaic) or GPU (Triton), by platform or by request."""

from __future__ import annotations

import jax

VARIANTS = ("tpu", "gpu")


def pick_variant(variant: str | None, interpret: bool) -> str:
  """"tpu" on TPU, "gpu" on GPU; on CPU (interpret mode only) the GPU-flavoured kernel, whose
  plain interpreter is much faster than TPU interpret mode. An explicit variant wins."""
  if variant is not None:
    if variant not in VARIANTS:
      raise ValueError(f"variant: expected one of {VARIANTS}, got {variant!r}")
    return variant
  backend = jax.default_backend()
  if backend == "tpu":
    return "tpu"
  if backend in ("gpu", "cuda", "rocm"):
    return "gpu"
  if not interpret:
    raise ValueError(f"interpret: Pallas kernels need a TPU or GPU; on {backend} pass "
                     "interpret=True")
  return "gpu"
