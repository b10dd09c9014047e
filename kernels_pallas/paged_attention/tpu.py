"""Paged attention for decode: a Pallas TPU (Mosaic) kernel.

One new query token per sequence attends to that sequence's paged KV cache. The
kv pages stay in HBM; per (sequence, kv head) program the kernel walks the
sequence's pages one compute block (`pages_per_compute_block` pages) at a time,
DMA-ing each block into a VMEM double buffer while the previous block is being
computed on, and folds each block into an online softmax held in float32 VMEM
scratch. The query heads that share a kv head (grouped-query attention) are
computed together as the rows of one small matmul. Blocks past the sequence
length are never copied nor computed.
"""

from __future__ import annotations

import functools

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels_pallas.tpu_dma import block_dma
import jax.numpy as jnp

# Target tokens per compute block when the caller does not choose.
_DEFAULT_BLOCK_TOKENS = 256
_F32 = lax.Precision.HIGHEST   # full float32 matmul passes on the MXU


def _paged_attention_kernel(
    lengths_ref,        # SMEM i32[batch]
    page_indices_ref,   # SMEM i32[batch * pages_per_seq]
    q_ref,              # VMEM f32[group, head_dim]: query heads of one kv head
    k_hbm,              # HBM  [num_kv_heads, total_pages, page_size, head_dim]
    v_hbm,              # HBM  [num_kv_heads, total_pages, page_size, head_dim]
    o_ref,              # VMEM f32[group, head_dim]
    k_buf,              # VMEM [2, block_tokens, head_dim]: double buffer
    v_buf,              # VMEM [2, block_tokens, head_dim]
    sems,               # DMA semaphores [2 (k, v), 2 (slot)]
    m_ref,              # VMEM f32[group, 1]: running max
    l_ref,              # VMEM f32[group, 1]: running softmax denominator
    acc_ref,            # VMEM f32[group, head_dim]: running numerator
    *,
    sm_scale: float,
    pages_per_block: int,
    pages_per_seq: int,
):
  b, h = pl.program_id(0), pl.program_id(1)
  page_size = k_hbm.shape[2]
  block_tokens = pages_per_block * page_size
  length = lengths_ref[b]
  num_pages = pl.cdiv(length, page_size)
  num_blocks = pl.cdiv(length, block_tokens)
  dma = functools.partial(
      block_dma, k_hbm, v_hbm, k_buf, v_buf, sems, page_indices_ref,
      seq_base=b * pages_per_seq, head=h, num_pages=num_pages,
      pages_per_block=pages_per_block)

  m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)
  l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
  acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)
  dma(block=0, slot=0, wait=False)
  q = q_ref[...]                                                       # [G, D]

  def body(i, slot):
    # Prefetch block i + 1 into the other slot before touching block i.
    @pl.when(i + 1 < num_blocks)
    def _():
      dma(block=i + 1, slot=1 - slot, wait=False)

    dma(block=i, slot=slot, wait=True)
    k = k_buf[slot].astype(jnp.float32)                                # [T, D]
    s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=_F32,
                        preferred_element_type=jnp.float32) * sm_scale  # [G, T]
    pos_s = i * block_tokens + lax.broadcasted_iota(jnp.int32, s.shape, 1)
    s = jnp.where(pos_s < length, s, -jnp.inf)
    # Rows past the length may be stale or never copied: zero them so that a
    # zero probability cannot meet a NaN.
    pos_v = i * block_tokens + lax.broadcasted_iota(jnp.int32, k.shape, 0)
    v = jnp.where(pos_v < length, v_buf[slot].astype(jnp.float32), 0.0)  # [T, D]

    # Every processed block holds at least one valid key, so m_new is finite.
    m_prev = m_ref[...]                                                # [G, 1]
    m_new = jnp.maximum(m_prev, s.max(axis=1, keepdims=True))
    p = jnp.exp(s - m_new)                                             # [G, T]
    alpha = jnp.exp(m_prev - m_new)
    l_ref[...] = alpha * l_ref[...] + p.sum(axis=1, keepdims=True)
    acc_ref[...] = alpha * acc_ref[...] + jnp.dot(
        p, v, precision=_F32, preferred_element_type=jnp.float32)
    m_ref[...] = m_new
    return 1 - slot

  lax.fori_loop(0, num_blocks, body, 0)
  o_ref[...] = acc_ref[...] / l_ref[...]


def _default_pages_per_compute_block(page_size: int, pages_per_seq: int) -> int:
  """About _DEFAULT_BLOCK_TOKENS keys, a multiple of 128 (one lane width) when
  page_size divides 128, and no more 128-key groups than a sequence can use."""
  lane_pages = max(1, 128 // page_size)
  cap = pl.cdiv(pages_per_seq, lane_pages) * lane_pages
  return max(1, min(_DEFAULT_BLOCK_TOKENS // page_size, cap))


@functools.partial(
    jax.jit,
    static_argnames=("sm_scale", "pages_per_compute_block", "interpret"))
def paged_attention_tpu(q, k_pages, v_pages, lengths, page_indices, *,
                        sm_scale: float,
                        pages_per_compute_block: int | None = None,
                        interpret: bool = False):
  """Decode attention of one query token per sequence over a paged KV cache.

  Args:
    q: [batch, num_heads, head_dim] queries (float32 or bfloat16).
    k_pages: [num_kv_heads, total_pages, page_size, head_dim] key pages.
    v_pages: [num_kv_heads, total_pages, page_size, head_dim] value pages.
    lengths: i32[batch], tokens in each sequence's cache (>= 1), including the
      newest one.
    page_indices: i32[batch, pages_per_seq], the pages of each sequence in
      order; entries past a sequence's length may be any valid page id.
    sm_scale: scale applied to the attention scores.
    pages_per_compute_block: pages copied and computed on per step of the
      inner loop; None picks about 256 keys (fewer for short pages_per_seq).
      Need not divide pages_per_seq.
    interpret: run the kernel in TPU interpret mode on CPU instead of
      compiling it with Mosaic.

  Returns:
    [batch, num_heads, head_dim] attention output in q's dtype. Query head h
    reads kv head h // (num_heads // num_kv_heads).
  """
  batch, num_heads, head_dim = q.shape
  num_kv_heads, _, page_size, _ = k_pages.shape
  pages_per_seq = page_indices.shape[1]
  group = num_heads // num_kv_heads
  pages_per_block = pages_per_compute_block or _default_pages_per_compute_block(
      page_size, pages_per_seq)
  block_tokens = pages_per_block * page_size
  # q and out travel as float32 (the kernel computes in it anyway; they are
  # small). Below 8 heads per kv head, give each head its own [1, head_dim]
  # row so the [group, head_dim] block is not a partial (8, 128) tile.
  if group % 8 == 0:
    q_in = q.astype(jnp.float32)
    qo_spec = pl.BlockSpec((None, group, head_dim), lambda b, h, *_: (b, h, 0))
  else:
    q_in = q.astype(jnp.float32).reshape(batch, num_heads, 1, head_dim)
    qo_spec = pl.BlockSpec((None, group, None, head_dim),
                           lambda b, h, *_: (b, h, 0, 0))

  kernel = functools.partial(
      _paged_attention_kernel, sm_scale=sm_scale,
      pages_per_block=pages_per_block, pages_per_seq=pages_per_seq)
  out = pl.pallas_call(
      kernel,
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=2,                   # lengths, page_indices
          grid=(batch, num_kv_heads),
          in_specs=[
              qo_spec,                             # q
              pl.BlockSpec(memory_space=pl.ANY),   # k_pages, left in HBM
              pl.BlockSpec(memory_space=pl.ANY),   # v_pages, left in HBM
          ],
          out_specs=qo_spec,
          scratch_shapes=[
              pltpu.VMEM((2, block_tokens, head_dim), k_pages.dtype),  # k_buf
              pltpu.VMEM((2, block_tokens, head_dim), v_pages.dtype),  # v_buf
              pltpu.SemaphoreType.DMA((2, 2)),                         # sems
              pltpu.VMEM((group, 1), jnp.float32),                     # m
              pltpu.VMEM((group, 1), jnp.float32),                     # l
              pltpu.VMEM((group, head_dim), jnp.float32),              # acc
          ],
      ),
      out_shape=jax.ShapeDtypeStruct(q_in.shape, jnp.float32),
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel")),
      interpret=pltpu.InterpretParams() if interpret else False,
  )(lengths, page_indices.reshape(-1), q_in, k_pages, v_pages)
  return out.reshape(batch, num_heads, head_dim).astype(q.dtype)
