"""Paged decode attention on GPU (Pallas, Triton lowering).

One new query token per sequence attends to that sequence's paged KV cache. Decode is
memory bound, so the kernel is laid out to read every K/V byte once:

* a program serves all query heads of one kv head (grouped-query attention), so a page
  is fetched once per kv head rather than once per query head; the head group is padded
  to 16 rows because Triton's `dot` needs every dimension >= 16;
* the loop over compute blocks (`pages_per_compute_block` pages each, gathered through
  the block table) stops at the sequence's length, a dynamic bound read from `lengths`;
* "flash decoding": a grid axis splits each sequence's live blocks into `k_splits`
  partitions, so batch x kv_heads small still fills the GPU. Each split writes an
  unnormalised partial (o, m, l) in float32; a cheap jnp epilogue merges them.
"""

from __future__ import annotations

import functools

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
import jax.numpy as jnp

_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)
_MIN_BLOCK_H = 16       # Triton dot: every operand dim must be >= 16.
_BLOCK_TOKENS = 128     # Default compute block, in tokens.
_TARGET_PROGRAMS = 264  # About two waves over an H200's 132 SMs.
_MAX_SPLITS = 32


def _next_pow2(x: int) -> int:
  return 1 << max(0, (x - 1).bit_length())


def _decode_kernel(
    lengths_ref,       # [1] int32: tokens in this sequence's cache
    page_indices_ref,  # [pages_per_seq] int32: this sequence's block table
    q_ref,             # [block_h, head_dim]: query heads of one kv head, zero padded
    k_pages_ref,       # [total_pages, page_size, head_dim]: one kv head's key pages
    v_pages_ref,       # [total_pages, page_size, head_dim]: one kv head's value pages
    o_ref,             # [block_h, head_dim] f32: unnormalised partial output
    m_ref,             # [block_h] f32: running max of the scaled scores
    l_ref,             # [block_h] f32: running softmax denominator
    *,
    sm_scale: float,
    pages_per_block: int,
    k_splits: int,
    precision,
):
  split = pl.program_id(2)
  block_h, head_dim = q_ref.shape
  page_size = k_pages_ref.shape[1]
  block_k = pages_per_block * page_size
  length = lengths_ref[0]

  # This split's share of the sequence's live compute blocks (may be empty).
  num_blocks = pl.cdiv(length, block_k)
  blocks_per_split = pl.cdiv(num_blocks, k_splits)
  start = split * blocks_per_split
  end = jnp.minimum(start + blocks_per_split, num_blocks)
  q = q_ref[...]

  def body(i, carry):
    o_prev, m_prev, l_prev = carry
    pages = page_indices_ref[pl.ds(i * pages_per_block, pages_per_block)]
    k = k_pages_ref[pages].reshape(block_k, head_dim)        # [block_k, head_dim]
    v = v_pages_ref[pages].reshape(block_k, head_dim)        # [block_k, head_dim]
    s = plgpu.dot(q, k, trans_b=True, precision=precision) * sm_scale  # [block_h, block_k]
    live = i * block_k + jnp.arange(block_k) < length
    s = jnp.where(live[None, :], s, _MASK_VALUE)
    # Slots past the length (a page's tail, table padding) may hold a previous owner's
    # NaN/inf: zero them, since a zero probability times NaN (or inf) is still NaN.
    v = jnp.where(live[:, None], v, jnp.zeros((), v.dtype))
    m_next = jnp.maximum(m_prev, s.max(axis=1))
    alpha = jnp.exp(m_prev - m_next)
    p = jnp.exp(s - m_next[:, None])
    l_next = alpha * l_prev + p.sum(axis=1)
    pv = plgpu.dot(p.astype(v.dtype), v, precision=precision)   # [block_h, head_dim]
    return alpha[:, None] * o_prev + pv, m_next, l_next

  init = (jnp.zeros((block_h, head_dim), jnp.float32),
          jnp.full((block_h,), -jnp.inf, jnp.float32),
          jnp.zeros((block_h,), jnp.float32))
  o, m, l = lax.fori_loop(start, end, body, init)
  o_ref[...] = o
  m_ref[...] = m
  l_ref[...] = l


def _default_k_splits(batch: int, num_kv_heads: int, max_blocks: int) -> int:
  wanted = pl.cdiv(_TARGET_PROGRAMS, batch * num_kv_heads)
  return max(1, min(wanted, max_blocks, _MAX_SPLITS))


@functools.partial(
    jax.jit, static_argnames=("sm_scale", "pages_per_compute_block", "interpret"))
def paged_attention_gpu(
    q: jax.Array,
    k_pages: jax.Array,
    v_pages: jax.Array,
    lengths: jax.Array,
    page_indices: jax.Array,
    *,
    sm_scale: float,
    pages_per_compute_block: int | None = None,
    interpret: bool = False,
) -> jax.Array:
  """Decode attention of one query token per sequence over a paged KV cache.

  Args:
    q: [batch, num_heads, head_dim] queries (float32 or bfloat16).
    k_pages: [num_kv_heads, total_pages, page_size, head_dim] key pages; page_size a
      power of two >= 8. num_heads must be a multiple of num_kv_heads (query head h
      reads kv head h // (num_heads // num_kv_heads)).
    v_pages: [num_kv_heads, total_pages, page_size, head_dim] value pages.
    lengths: int32 [batch] tokens in each sequence's cache (>= 1), the newest included.
    page_indices: int32 [batch, pages_per_seq] block tables; entries past a sequence's
      length must be valid page ids (their contents are masked out).
    sm_scale: scale applied to q.k before the softmax.
    pages_per_compute_block: pages per inner-loop block (rounded up to a power of two,
      at least 16 tokens). None picks about 128 tokens.
    interpret: run the kernel in Pallas interpret mode (CPU testing).

  Returns:
    [batch, num_heads, head_dim] attention output in q's dtype, computed in float32.
  """
  batch, num_heads, head_dim = q.shape
  num_kv_heads, _, page_size, _ = k_pages.shape
  pages_per_seq = page_indices.shape[1]
  group = num_heads // num_kv_heads
  block_h = max(_MIN_BLOCK_H, _next_pow2(group))

  ppcb = pages_per_compute_block
  if ppcb is None:
    ppcb = min(max(1, _BLOCK_TOKENS // page_size), _next_pow2(pages_per_seq))
  ppcb = _next_pow2(max(ppcb, pl.cdiv(16, page_size)))
  max_blocks = pl.cdiv(pages_per_seq, ppcb)
  if pages_per_seq % ppcb:  # Whole compute blocks only: pad the block tables with page 0.
    page_indices = jnp.pad(page_indices, ((0, 0), (0, max_blocks * ppcb - pages_per_seq)))
  k_splits = _default_k_splits(batch, num_kv_heads, max_blocks)

  q_grouped = q.reshape(batch, num_kv_heads, group, head_dim)
  if block_h != group:
    q_grouped = jnp.pad(q_grouped, ((0, 0), (0, 0), (0, block_h - group), (0, 0)))
  precision = lax.Precision.HIGHEST if q.dtype == jnp.float32 else None

  kernel = functools.partial(
      _decode_kernel, sm_scale=sm_scale, pages_per_block=ppcb, k_splits=k_splits,
      precision=precision)
  total_pages = k_pages.shape[1]
  pages_shape = (None, total_pages, page_size, head_dim)
  part_shape = (k_splits, batch, num_kv_heads, block_h)
  o, m, l = pl.pallas_call(
      kernel,
      grid=(batch, num_kv_heads, k_splits),
      in_specs=[
          pl.BlockSpec((1,), lambda b, h, s: (b,)),                               # lengths
          pl.BlockSpec((None, page_indices.shape[1]), lambda b, h, s: (b, 0)),  # page_indices
          pl.BlockSpec((None, None, block_h, head_dim),
                       lambda b, h, s: (b, h, 0, 0)),                            # q
          pl.BlockSpec(pages_shape, lambda b, h, s: (h, 0, 0, 0)),               # k_pages
          pl.BlockSpec(pages_shape, lambda b, h, s: (h, 0, 0, 0)),               # v_pages
      ],
      out_specs=[
          pl.BlockSpec((None, None, None, block_h, head_dim),
                       lambda b, h, s: (s, b, h, 0, 0)),                         # o
          pl.BlockSpec((None, None, None, block_h), lambda b, h, s: (s, b, h, 0)),  # m
          pl.BlockSpec((None, None, None, block_h), lambda b, h, s: (s, b, h, 0)),  # l
      ],
      out_shape=[
          jax.ShapeDtypeStruct((*part_shape, head_dim), jnp.float32),
          jax.ShapeDtypeStruct(part_shape, jnp.float32),
          jax.ShapeDtypeStruct(part_shape, jnp.float32),
      ],
      compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2),
      interpret=interpret,
      name=f"paged_decode_attention_ppcb{ppcb}_splits{k_splits}",
  )(lengths.astype(jnp.int32), page_indices.astype(jnp.int32), q_grouped, k_pages, v_pages)

  # Merge the splits (split 0 always holds the first block, so m_max is finite).
  m_max = m.max(axis=0)
  w = jnp.exp(m - m_max[None])                                   # empty splits -> 0
  denom = (w * l).sum(axis=0)
  out = (w[..., None] * o).sum(axis=0) / denom[..., None]
  return out[:, :, :group].reshape(batch, num_heads, head_dim).astype(q.dtype)
