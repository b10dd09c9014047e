"""XLA (jnp) attention over the paged KV cache: the kernels' XLA implementation, CPU default.

One page layout per layer: `k_pages`, `v_pages` of shape `[num_kv_heads, total_pages,
page_size, head_dim]`. `paged_attention_xla` / `ragged_paged_attention_xla` take the same
arguments as the Pallas kernels beside them, so the model swaps implementations through
`attention_ops.AttentionOps` without knowing which runs. Unlike the `reference.py` oracles
these are jittable and GSPMD-partitionable (the serving path). Grouped-query attention: query
head h reads kv head h // (H / KVH).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def write_kv(k_pages, v_pages, k, v, slot_mapping):
  """Scatters new keys/values into their pages.

  Args:
    k_pages, v_pages: [KVH, P, page_size, D].
    k, v: [T, KVH, D] for T new tokens.
    slot_mapping: int32 [T], flat slot `page * page_size + offset`; padding tokens carry an
      out-of-range slot (>= P * page_size) and are dropped.
  Returns:
    Updated (k_pages, v_pages).
  """
  kvh, num_pages, page_size, d = k_pages.shape

  def scatter(pages, new):
    flat = pages.reshape(kvh, num_pages * page_size, d)
    flat = flat.at[:, slot_mapping].set(new.transpose(1, 0, 2).astype(pages.dtype), mode="drop")
    return flat.reshape(kvh, num_pages, page_size, d)

  return scatter(k_pages, k), scatter(v_pages, v)


def _softmax_attend(scores, mask, v, spec):
  """Masked softmax over the last axis in float32, then the weighted sum of v by einsum spec.
  Callers zero v outside the mask: a zero probability times a stale page's NaN is still NaN."""
  scores = jnp.where(mask, scores, -jnp.inf)
  probs = jax.nn.softmax(scores, axis=-1)
  probs = jnp.where(mask, probs, 0.0)  # rows with no valid key stay zero instead of NaN
  return jnp.einsum(spec, probs, v.astype(jnp.float32))


def paged_attention_xla(q, k_pages, v_pages, lengths, page_indices, *, sm_scale=None):
  """Decode attention: one query token per sequence over its cached tokens.

  Args:
    q: [B, H, D], the query of the newest token of each sequence.
    k_pages, v_pages: [KVH, P, page_size, D].
    lengths: int32 [B], tokens in the cache for each sequence (the newest included), >= 1.
    page_indices: int32 [B, pages_per_seq], each sequence's block table (padded).
  Returns:
    [B, H, D] in q's dtype.
  """
  b, h, d = q.shape
  kvh = k_pages.shape[0]
  scale = d ** -0.5 if sm_scale is None else sm_scale
  k = k_pages[:, page_indices].reshape(kvh, b, -1, d)   # [KVH, B, L, D]
  v = v_pages[:, page_indices].reshape(kvh, b, -1, d)
  qg = q.reshape(b, kvh, h // kvh, d).astype(jnp.float32)
  scores = jnp.einsum("bkgd,kbld->bkgl", qg, k.astype(jnp.float32)) * scale
  mask = jnp.arange(k.shape[2])[None, :] < lengths[:, None]              # [B, L]
  v = jnp.where(mask[None, :, :, None], v, 0)   # slots past the length: another owner's data
  out = _softmax_attend(scores, mask[:, None, None, :], v, "bkgl,kbld->bkgd")
  return out.reshape(b, h, d).astype(q.dtype)


def ragged_paged_attention_xla(q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens,
                               num_seqs, *, sm_scale=None):
  """Causal attention for a packed batch of query tokens (prefill, chunked prefill, mixed).

  Sequence s owns query rows cu_q_lens[s]:cu_q_lens[s+1]; they are the last q_len positions of
  its kv_lens[s] tokens, so a prefix already in the cache is attended to.

  Args:
    q: [T, H, D], packed new query tokens (padded to a bucket).
    k_pages, v_pages: [KVH, P, page_size, D] (the new tokens are already written).
    kv_lens: int32 [S], page_indices: int32 [S, pages_per_seq], cu_q_lens: int32 [S + 1],
    num_seqs: int32 [1]; only the first num_seqs sequences are valid.
  Returns:
    [T, H, D] in q's dtype; padding rows are zeros.
  """
  t, h, d = q.shape
  kvh = k_pages.shape[0]
  max_seqs = page_indices.shape[0]
  scale = d ** -0.5 if sm_scale is None else sm_scale
  token = jnp.arange(t)
  seq = jnp.minimum(jnp.searchsorted(cu_q_lens[1:], token, side="right"), max_seqs - 1)
  valid = token < cu_q_lens[num_seqs[0]]
  q_lens = cu_q_lens[1:] - cu_q_lens[:-1]
  q_pos = kv_lens[seq] - q_lens[seq] + (token - cu_q_lens[seq])       # absolute position
  # Each token gathers its own sequence's keys: [KVH, T, L, D]. (A gather of every sequence
  # for every token would cost max_seqs times more, which chunked prefill's wide batches feel.)
  k = k_pages[:, page_indices[seq]].reshape(kvh, t, -1, d)
  v = v_pages[:, page_indices[seq]].reshape(kvh, t, -1, d)
  mask = (jnp.arange(k.shape[2])[None, :] <= q_pos[:, None]) & valid[:, None]   # [T, L]
  v = jnp.where(mask[None, :, :, None], v, 0)   # never read (0 * NaN) what is not this row's

  qg = q.reshape(t, kvh, h // kvh, d).astype(jnp.float32)
  scores = jnp.einsum("tkgd,ktld->tkgl", qg, k.astype(jnp.float32)) * scale
  out = _softmax_attend(scores, mask[:, None, None, :], v, "tkgl,ktld->tkgd")
  return out.reshape(t, h, d).astype(q.dtype)


def dense_causal_attention(q, k, v, *, sm_scale=None):
  """No-cache reference: full causal attention of one sequence. q [T,H,D], k/v [T,KVH,D]."""
  t, h, d = q.shape
  kvh = k.shape[1]
  scale = d ** -0.5 if sm_scale is None else sm_scale
  qg = q.reshape(t, kvh, h // kvh, d).astype(jnp.float32)
  scores = jnp.einsum("tkgd,skd->tkgs", qg, k.astype(jnp.float32)) * scale
  mask = jnp.tril(jnp.ones((t, t), bool))
  out = _softmax_attend(scores, mask[:, None, None, :], v, "tkgs,skd->tkgd")
  return out.reshape(t, h, d).astype(q.dtype)
