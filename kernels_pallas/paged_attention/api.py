"""Public decode paged attention: validates arguments, picks the platform kernel."""

from __future__ import annotations

from kernels_pallas import checks
from kernels_pallas.platform import pick_variant


def paged_attention(q, k_pages, v_pages, lengths, page_indices, *, sm_scale=None,
                    pages_per_compute_block=None, interpret=False, variant=None):
  """Attention of one new query token per sequence over its paged KV cache.

  Args:
    q: [batch, num_heads, head_dim], float32 or bfloat16.
    k_pages, v_pages: [num_kv_heads, total_pages, page_size, head_dim]; num_heads is a
      multiple of num_kv_heads (grouped-query attention).
    lengths: int32 [batch], tokens in the cache per sequence (>= 1, the newest included).
    page_indices: int32 [batch, pages_per_seq], each sequence's block table.
    sm_scale: score scale, default head_dim ** -0.5.
    pages_per_compute_block: pages per inner block (default: chosen by the kernel).
    interpret: run the kernel in Pallas interpret mode (CPU); the TPU variant in TPU
      interpret mode.
    variant: "tpu" | "gpu" to force a kernel flavour; default by platform.
  Returns:
    [batch, num_heads, head_dim] in q's dtype.
  """
  checks.check_decode_args(q, k_pages, v_pages, lengths, page_indices, pages_per_compute_block)
  scale = q.shape[-1] ** -0.5 if sm_scale is None else float(sm_scale)
  if pick_variant(variant, interpret) == "tpu":
    from kernels_pallas.paged_attention.tpu import paged_attention_tpu as kernel
  else:
    from kernels_pallas.paged_attention.gpu import paged_attention_gpu as kernel
  return kernel(q, k_pages, v_pages, lengths, page_indices, sm_scale=scale,
                pages_per_compute_block=pages_per_compute_block, interpret=interpret)
