"""Public ragged paged attention (prefill, chunked prefill, mixed batches)."""

from __future__ import annotations

from kernels_pallas import checks
from kernels_pallas.platform import pick_variant


def ragged_paged_attention(q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, num_seqs, *,
                           sm_scale=None, interpret=False, variant=None):
  """Causal attention for a packed batch of new query tokens over paged KV.

  Sequence s owns q rows cu_q_lens[s]:cu_q_lens[s+1], the last q_len positions of its
  kv_lens[s] tokens (a prefix already in the cache is attended to).

  Args:
    q: [total_q_tokens, num_heads, head_dim], float32 or bfloat16.
    k_pages, v_pages: [num_kv_heads, total_pages, page_size, head_dim].
    kv_lens: int32 [max_seqs]; page_indices: int32 [max_seqs, pages_per_seq];
    cu_q_lens: int32 [max_seqs + 1]; num_seqs: int32 [1], how many sequences are valid.
    sm_scale: score scale, default head_dim ** -0.5.
    interpret: Pallas interpret mode (CPU); variant: "tpu" | "gpu", default by platform.
  Returns:
    [total_q_tokens, num_heads, head_dim] in q's dtype; rows of no valid sequence are zeros.
  """
  checks.check_ragged_args(q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, num_seqs)
  scale = q.shape[-1] ** -0.5 if sm_scale is None else float(sm_scale)
  if pick_variant(variant, interpret) == "tpu":
    from kernels_pallas.prefill_attention.tpu import ragged_paged_attention_tpu as kernel
  else:
    from kernels_pallas.prefill_attention.gpu import ragged_paged_attention_gpu as kernel
  return kernel(q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, num_seqs,
                sm_scale=scale, interpret=interpret)
