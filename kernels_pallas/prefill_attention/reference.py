"""Dense, obviously-correct reference for ragged paged attention (prefill, chunked, mixed).

A Python loop over the valid sequences: de-page the sequence's kv_len keys/values, attend its
q_len new queries (the last q_len positions) causally, leave padding rows at zero.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def ragged_paged_attention_reference(q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens,
                                     num_seqs, *, sm_scale=None):
  """q [T, H, D]; k/v_pages [KVH, P, page_size, D]; kv_lens [S]; page_indices [S, pages];
  cu_q_lens [S + 1]; num_seqs [1] -> [T, H, D] in q's dtype. Not jittable (host loop)."""
  t, h, d = q.shape
  kvh, _, page_size, _ = k_pages.shape
  scale = d ** -0.5 if sm_scale is None else sm_scale
  kv_lens, page_indices = np.asarray(kv_lens), np.asarray(page_indices)
  cu_q_lens, n = np.asarray(cu_q_lens), int(np.asarray(num_seqs)[0])
  out = jnp.zeros((t, h, d), jnp.float32)
  for s in range(n):
    q_start, q_end, kv_len = int(cu_q_lens[s]), int(cu_q_lens[s + 1]), int(kv_lens[s])
    q_len = q_end - q_start
    if q_len == 0:
      continue
    pages = page_indices[s, :-(-kv_len // page_size)]
    k = k_pages[:, pages].reshape(kvh, -1, d)[:, :kv_len].astype(jnp.float32)  # [KVH, kv, D]
    v = v_pages[:, pages].reshape(kvh, -1, d)[:, :kv_len].astype(jnp.float32)
    k, v = jnp.repeat(k, h // kvh, axis=0), jnp.repeat(v, h // kvh, axis=0)   # [H, kv, D]
    qs = q[q_start:q_end].astype(jnp.float32)                                 # [q_len, H, D]
    scores = jnp.einsum("qhd,hkd->hqk", qs, k) * scale
    q_pos = kv_len - q_len + np.arange(q_len)
    causal = np.arange(kv_len)[None, :] <= q_pos[:, None]                     # [q_len, kv]
    probs = jax.nn.softmax(jnp.where(causal[None], scores, -jnp.inf), axis=-1)
    out = out.at[q_start:q_end].set(jnp.einsum("hqk,hkd->qhd", probs, v))
  return out.astype(q.dtype)
