"""Paged attention: Pallas kernels (TPU: Mosaic, GPU: Triton), their XLA implementation, and a
jnp reference (the oracle) for each. Imports nothing from pdjax: models and engine build on it.

  paged_attention(q, k_pages, v_pages, lengths, page_indices, ...)            decode
  ragged_paged_attention(q, k_pages, v_pages, kv_lens, page_indices,
                         cu_q_lens, num_seqs, ...)                           prefill / mixed
  xla_attention: the same two calls in jnp (the CPU default), write_kv, dense attention
  attention_ops.AttentionOps: the model's calls, bound to "xla" or "pallas" and a mesh
"""

from kernels_pallas.paged_attention.api import paged_attention
from kernels_pallas.paged_attention.reference import paged_attention_reference
from kernels_pallas.prefill_attention.api import ragged_paged_attention
from kernels_pallas.prefill_attention.reference import ragged_paged_attention_reference
from kernels_pallas.xla_attention import paged_attention_xla, ragged_paged_attention_xla

__all__ = ["paged_attention", "paged_attention_reference", "paged_attention_xla",
           "ragged_paged_attention", "ragged_paged_attention_reference",
           "ragged_paged_attention_xla"]
