"""Dense, obviously-correct jnp reference for decode paged attention (the kernels' oracle).

De-page each sequence's keys and values, repeat kv heads up to the query heads, then a plain
masked softmax attention in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def paged_attention_reference(q, k_pages, v_pages, lengths, page_indices, *, sm_scale=None):
  """q [B, H, D]; k/v_pages [KVH, P, page_size, D]; lengths [B]; page_indices [B, pages_per_seq]
  -> [B, H, D] in q's dtype."""
  b, h, d = q.shape
  kvh = k_pages.shape[0]
  scale = d ** -0.5 if sm_scale is None else sm_scale
  k = k_pages[:, page_indices].reshape(kvh, b, -1, d).astype(jnp.float32)   # [KVH, B, L, D]
  v = v_pages[:, page_indices].reshape(kvh, b, -1, d).astype(jnp.float32)
  k = jnp.repeat(k, h // kvh, axis=0)                                       # [H, B, L, D]
  v = jnp.repeat(v, h // kvh, axis=0)
  scores = jnp.einsum("bhd,hbld->bhl", q.astype(jnp.float32), k) * scale
  valid = jnp.arange(k.shape[2])[None, None, :] < lengths[:, None, None]
  probs = jax.nn.softmax(jnp.where(valid, scores, -jnp.inf), axis=-1)
  return jnp.einsum("bhl,hbld->bhd", probs, v).astype(q.dtype)
