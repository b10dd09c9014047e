"""Pallas paged-attention kernels (TPU: Mosaic, GPU: Triton), each with a jnp reference.

  paged_attention(q, k_pages, v_pages, lengths, page_indices, ...)            decode
  ragged_paged_attention(q, k_pages, v_pages, kv_lens, page_indices,
                         cu_q_lens, num_seqs, ...)                           prefill / mixed
"""

from kernels_pallas.paged_attention.api import paged_attention
from kernels_pallas.paged_attention.reference import paged_attention_reference
from kernels_pallas.prefill_attention.api import ragged_paged_attention
from kernels_pallas.prefill_attention.reference import ragged_paged_attention_reference

__all__ = ["paged_attention", "paged_attention_reference", "ragged_paged_attention",
           "ragged_paged_attention_reference"]
