"""Random paged-attention inputs for the kernel tests: pages in permuted order, fresh each case."""

import jax.numpy as jnp
import numpy as np


def awkward_lengths(page_size: int, long: int = 300) -> list[int]:
  return [1, page_size - 1, page_size, page_size + 1, long]


def _pools(rng, num_kv_heads, total_pages, page_size, head_dim, dtype):
  shape = (num_kv_heads, total_pages, page_size, head_dim)
  return (jnp.asarray(rng.standard_normal(shape), dtype),
          jnp.asarray(rng.standard_normal(shape), dtype))


def _tables(rng, kv_lens, page_size, total_pages):
  """Block tables over a random permutation of the pool; unused entries point at real pages."""
  pages_per_seq = max(-(-n // page_size) for n in kv_lens) + 1
  perm = rng.permutation(total_pages)
  table = perm[:len(kv_lens) * pages_per_seq].reshape(len(kv_lens), pages_per_seq)
  return jnp.asarray(table, jnp.int32)


def decode_case(seed, *, lengths, page_size, head_dim, num_kv_heads, gqa, dtype):
  rng = np.random.default_rng(seed)
  pages_per_seq = max(-(-n // page_size) for n in lengths) + 1
  total_pages = len(lengths) * pages_per_seq + 5
  k_pages, v_pages = _pools(rng, num_kv_heads, total_pages, page_size, head_dim, dtype)
  q = jnp.asarray(rng.standard_normal((len(lengths), num_kv_heads * gqa, head_dim)), dtype)
  return (q, k_pages, v_pages, jnp.asarray(lengths, jnp.int32),
          _tables(rng, lengths, page_size, total_pages))


def ragged_case(seed, *, q_lens, kv_lens, page_size, head_dim, num_kv_heads, gqa, dtype,
                max_seqs=None, pad_tokens=0):
  """Sequences with q_lens new tokens at the end of kv_lens tokens; max_seqs > len(q_lens)
  adds padding sequences, pad_tokens adds padding query rows past the last valid one."""
  rng = np.random.default_rng(seed)
  n = len(q_lens)
  max_seqs = max_seqs or n
  all_kv = list(kv_lens) + [1] * (max_seqs - n)
  pages_per_seq = max(-(-k // page_size) for k in all_kv) + 1
  total_pages = max_seqs * pages_per_seq + 5
  k_pages, v_pages = _pools(rng, num_kv_heads, total_pages, page_size, head_dim, dtype)
  total_q = sum(q_lens) + pad_tokens
  q = jnp.asarray(rng.standard_normal((total_q, num_kv_heads * gqa, head_dim)), dtype)
  cu = np.zeros(max_seqs + 1, np.int32)
  cu[1:n + 1] = np.cumsum(q_lens)
  cu[n + 1:] = cu[n]
  return (q, k_pages, v_pages, jnp.asarray(all_kv, jnp.int32),
          _tables(rng, all_kv, page_size, total_pages), jnp.asarray(cu),
          jnp.asarray([n], jnp.int32))


TOLERANCE = {jnp.float32: dict(atol=2e-5, rtol=2e-5), jnp.bfloat16: dict(atol=2e-2, rtol=2e-2)}
