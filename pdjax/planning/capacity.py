"""Per-instance memory: does a model fit on TP chips, and how many KV pages remain.

  weights per chip  = weight_bytes / tp
  KV pages          = (tp * hbm_bytes * mem_util - weight_bytes) / (page_size * kv_bytes/token)
An instance fits when its pages hold at least one max_model_len sequence. Pure Python.
"""

from __future__ import annotations

from pdjax.models.llama_config import LlamaConfig
from pdjax.sim.hardware import Hardware
from pdjax.sim.roofline import RooflineCost


def kv_pages(mcfg: LlamaConfig, hw: Hardware, tp: int, *, page_size: int, dtype_bytes: int,
             mem_util: float) -> int:
  """KV pages an instance of `tp` chips holds after its weights (0 or less: does not fit)."""
  cost = RooflineCost(mcfg, hw, tp, dtype_bytes=dtype_bytes)
  free = tp * hw.hbm_bytes * mem_util - cost.weight_bytes
  return int(free // (page_size * cost.kv_bytes_per_token()))


def pool_pages(mcfg: LlamaConfig, hw: Hardware, tp: int, *, page_size: int,
               dtype_bytes: int, mem_util: float, max_model_len: int,
               max_batch: int) -> int | None:
  """The KV pool of an instance of `tp` chips, capped at what a full batch of max-length
  sequences plus as many queued prompts can use (a bigger pool changes nothing but the
  simulator's memory); None when it cannot hold one sequence."""
  per_seq = -(-max_model_len // page_size)
  pages = kv_pages(mcfg, hw, tp, page_size=page_size, dtype_bytes=dtype_bytes,
                   mem_util=mem_util)
  if pages < per_seq:
    return None
  return min(pages, 2 * max_batch * per_seq)
