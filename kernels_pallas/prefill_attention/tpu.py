"""Ragged paged attention (prefill, chunked prefill, mixed): a Pallas TPU kernel.

The new query tokens of all sequences are packed back to back in one ragged
batch; sequence s owns rows cu_q_lens[s]:cu_q_lens[s + 1], which are the last
q_len of its kv_lens[s] cached tokens, and attends causally to its paged KV
cache (any cached prefix included).

The grid runs over (kv head, block of q_block token rows); each program owns
the rows of all the query heads of one kv head for its tokens, so every output
row, padding included, is written exactly once by one program. A block may hold
the tail of one sequence, several whole short ones and the head of another: the
program walks those sequences in order and, per sequence, the compute blocks
of kv pages up to the causal limit of its last row in the block. The walk is
flattened into one stream of (sequence, kv block) steps so the pages of the
next step (same sequence or the next one) are DMA-ed from HBM into the other
half of a VMEM double buffer while the current step is computed. Rows of other
sequences are masked out of each step, so one float32 online-softmax state per
row serves the whole block; rows no valid sequence owns end with an empty
softmax and are written as zeros.
"""

from __future__ import annotations

import functools

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels_pallas.tpu_dma import block_dma
import jax.numpy as jnp
import numpy as np

# A finite "minus infinity": fully masked rows stay NaN-free.
_MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
_Q_BLOCK_ROWS = 128       # target q rows (tokens x group) per program
_KV_BLOCK_TOKENS = 128    # target kv tokens per compute block
_F32 = lax.Precision.HIGHEST   # full float32 matmul passes on the MXU


def _ragged_paged_attention_kernel(
    kv_lens_ref,        # SMEM i32[max_seqs]
    page_indices_ref,   # SMEM i32[max_seqs * pages_per_seq]
    cu_q_lens_ref,      # SMEM i32[max_seqs + 1]
    num_seqs_ref,       # SMEM i32[1]
    q_ref,              # VMEM [q_block * group, head_dim]: row = token * group + g
    k_hbm,              # HBM  [num_kv_heads, total_pages, page_size, head_dim]
    v_hbm,              # HBM  [num_kv_heads, total_pages, page_size, head_dim]
    o_ref,              # VMEM [q_block * group, head_dim]
    k_buf,              # VMEM [2, block_tokens, head_dim]: double buffer
    v_buf,              # VMEM [2, block_tokens, head_dim]
    sems,               # DMA semaphores [2 (k, v), 2 (slot)]
    m_ref,              # VMEM f32[q_block * group, 1]: running max
    l_ref,              # VMEM f32[q_block * group, 1]: running denominator
    acc_ref,            # VMEM f32[q_block * group, head_dim]: running numerator
    *,
    sm_scale: float,
    group: int,
    q_block: int,
    pages_per_block: int,
    pages_per_seq: int,
):
  h, qb = pl.program_id(0), pl.program_id(1)
  page_size = k_hbm.shape[2]
  block_tokens = pages_per_block * page_size
  max_seqs = kv_lens_ref.shape[0]
  num_seqs = num_seqs_ref[0]
  row_lo, row_hi = qb * q_block, (qb + 1) * q_block   # this block's tokens

  def cu(s):
    return cu_q_lens_ref[s], cu_q_lens_ref[s + 1]

  def has_rows(s):   # seq s (< num_seqs) owns at least one row of the block
    start, end = cu(jnp.minimum(s, max_seqs - 1))
    return jnp.maximum(start, row_lo) < jnp.minimum(end, row_hi)

  def kv_limit(s):   # keys visible to the last row of seq s in the block
    _, end = cu(s)
    return kv_lens_ref[s] - (end - jnp.minimum(end, row_hi))

  def dma(s, block, slot, wait=False):
    block_dma(k_hbm, v_hbm, k_buf, v_buf, sems, page_indices_ref,
               seq_base=s * pages_per_seq, head=h, block=block, slot=slot,
               num_pages=pl.cdiv(kv_limit(s), page_size),
               pages_per_block=pages_per_block, wait=wait)

  # Sequences overlapping the block lie in [s_first, s_end) (cu is sorted);
  # next_seq skips those with no row here (q_len 0).
  s_first = lax.fori_loop(
      0, num_seqs, lambda s, n: n + (cu(s)[1] <= row_lo).astype(jnp.int32), 0)
  s_end = lax.fori_loop(
      0, num_seqs, lambda s, n: n + (cu(s)[0] < row_hi).astype(jnp.int32), 0)

  def next_seq(s):
    return lax.while_loop(
        lambda s: jnp.logical_and(s < s_end, jnp.logical_not(has_rows(s))),
        lambda s: s + 1, s)

  m_ref[...] = jnp.full(m_ref.shape, _MASK_VALUE, jnp.float32)
  l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
  acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)
  s0 = next_seq(s_first)

  @pl.when(s0 < s_end)
  def _():
    dma(s0, 0, 0)

  # Scores take q and k in their own dtype (bf16 products are exact in f32);
  # p @ v runs in float32 so bf16 output matches a float32 softmax.
  qk_precision = _F32 if q_ref.dtype == jnp.float32 else None
  shape = (q_ref.shape[0], block_tokens)                            # [R, T]

  def row_token():   # [R, T]: the token (q row index) of each score row
    row = lax.broadcasted_iota(jnp.int32, shape, 0)
    if group & (group - 1) == 0:
      return row_lo + lax.shift_right_logical(row, group.bit_length() - 1)
    # lax.div, not `//`: rows are >= 0, so truncation is the floor, and jnp's
    # floor_divide adds a lax.sign whose Mosaic lowering asks the local device
    # for its TPU generation (fails when lowering ahead of time from a CPU).
    return row_lo + lax.div(row, jnp.int32(group))

  def seq_step(carry):
    s, slot = carry
    start, end = cu(s)
    limit = kv_limit(s)
    num_blocks = pl.cdiv(limit, block_tokens)
    s_next = next_seq(s + 1)

    def kv_step(i, slot):
      @pl.when(i + 1 < num_blocks)
      def _():
        dma(s, i + 1, 1 - slot)

      @pl.when(jnp.logical_and(i + 1 == num_blocks, s_next < s_end))
      def _():
        dma(s_next, 0, 1 - slot)

      dma(s, i, slot, wait=True)
      q, k = q_ref[...], k_buf[slot]                                # [R|T, D]
      scores = lax.dot_general(
          q, k, (((1,), (1,)), ((), ())), precision=qk_precision,
          preferred_element_type=jnp.float32) * sm_scale            # [R, T]
      # Only rows of seq s are live; a token at absolute position
      # kv_len - end + token sees keys up to that position.
      token = row_token()
      key = i * block_tokens + lax.broadcasted_iota(jnp.int32, shape, 1)
      mask = jnp.logical_and(
          jnp.logical_and(token >= start, token < end),
          key <= kv_lens_ref[s] - end + token)
      scores = jnp.where(mask, scores, _MASK_VALUE)
      m_prev = m_ref[...]                                           # [R, 1]
      m_new = jnp.maximum(m_prev, scores.max(axis=1, keepdims=True))
      p = jnp.where(mask, jnp.exp(scores - m_new), 0.0)             # [R, T]
      alpha = jnp.exp(m_prev - m_new)
      l_ref[...] = alpha * l_ref[...] + p.sum(axis=1, keepdims=True)
      # Rows past the causal limit are stale or never copied: zero them so a
      # zero probability cannot meet a NaN.
      v_valid = i * block_tokens + lax.broadcasted_iota(
          jnp.int32, k.shape, 0) < limit
      v = jnp.where(v_valid, v_buf[slot].astype(jnp.float32), 0.0)  # [T, D]
      acc_ref[...] = alpha * acc_ref[...] + jnp.dot(
          p, v, precision=_F32, preferred_element_type=jnp.float32)
      m_ref[...] = m_new
      return 1 - slot

    return s_next, lax.fori_loop(0, num_blocks, kv_step, slot)

  lax.while_loop(lambda c: c[0] < s_end, seq_step, (s0, 0))
  l = l_ref[...]
  o_ref[...] = (acc_ref[...] / jnp.where(l == 0.0, 1.0, l)).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("sm_scale", "q_block", "interpret"))
def ragged_paged_attention_tpu(q, k_pages, v_pages, kv_lens, page_indices,
                               cu_q_lens, num_seqs, *, sm_scale: float,
                               q_block: int | None = None,
                               interpret: bool = False):
  """Causal attention of a ragged batch of new tokens over a paged KV cache.

  Args:
    q: [total_q_tokens, num_heads, head_dim] queries (float32 or bfloat16), the
      sequences' new tokens packed back to back.
    k_pages: [num_kv_heads, total_pages, page_size, head_dim] key pages.
    v_pages: [num_kv_heads, total_pages, page_size, head_dim] value pages.
    kv_lens: i32[max_seqs], tokens in each sequence's cache, new ones
      included (kv_len >= q_len).
    page_indices: i32[max_seqs, pages_per_seq], the pages of each sequence in
      order; entries past a sequence's length may be any valid page id.
    cu_q_lens: i32[max_seqs + 1], sequence s owns q rows
      cu_q_lens[s]:cu_q_lens[s + 1], its last q_len positions.
    num_seqs: i32[1], only the first num_seqs[0] sequences are valid.
    sm_scale: scale applied to the attention scores.
    q_block: token rows per program; None picks about 128 rows (tokens x
      group), a multiple of 16. Mosaic needs q_block * group to be a multiple
      of 8 (lower_check uses a bad one to prove its TPU check can fail).
    interpret: run the kernel in TPU interpret mode on CPU instead of
      compiling it with Mosaic.

  Returns:
    [total_q_tokens, num_heads, head_dim] in q's dtype: query at absolute
    position p attends to its sequence's keys 0..p; query head h reads kv head
    h // (num_heads // num_kv_heads); rows no valid sequence owns are zeros.
  """
  tokens, num_heads, head_dim = q.shape
  num_kv_heads, _, page_size, _ = k_pages.shape
  pages_per_seq = page_indices.shape[1]
  group = num_heads // num_kv_heads
  # Token rows per program: a multiple of 16 so q_block * group rows tile for
  # both float32 (8 sublanes) and bfloat16 (16); no more than the batch needs.
  if q_block is None:
    q_block = max(16, _Q_BLOCK_ROWS // group // 16 * 16)
    q_block = min(q_block, pl.cdiv(tokens, 16) * 16)
  num_q_blocks = pl.cdiv(tokens, q_block)
  padded = num_q_blocks * q_block
  # About _KV_BLOCK_TOKENS keys per block, in whole 128-key lane groups.
  lane_pages = max(1, 128 // page_size)
  pages_per_block = max(1, min(_KV_BLOCK_TOKENS // page_size,
                               pl.cdiv(pages_per_seq, lane_pages) * lane_pages))
  block_tokens = pages_per_block * page_size
  rows = q_block * group

  # [T, H, D] -> [KVH, T_pad * G, D]: the heads of one kv head become rows.
  qh = jnp.pad(q, ((0, padded - tokens), (0, 0), (0, 0)))
  qh = qh.reshape(padded, num_kv_heads, group, head_dim).transpose(1, 0, 2, 3)
  qh = qh.reshape(num_kv_heads, padded * group, head_dim)

  kernel = functools.partial(
      _ragged_paged_attention_kernel, sm_scale=sm_scale, group=group,
      q_block=q_block, pages_per_block=pages_per_block,
      pages_per_seq=pages_per_seq)
  # q and out: rows of q_block tokens x group heads of one kv head.
  qo_spec = pl.BlockSpec((None, rows, head_dim), lambda h, qb, *_: (h, qb, 0))
  out = pl.pallas_call(
      kernel,
      grid_spec=pltpu.PrefetchScalarGridSpec(
          # kv_lens, page_indices, cu_q_lens, num_seqs
          num_scalar_prefetch=4,
          grid=(num_kv_heads, num_q_blocks),
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
              pltpu.VMEM((rows, 1), jnp.float32),                      # m
              pltpu.VMEM((rows, 1), jnp.float32),                      # l
              pltpu.VMEM((rows, head_dim), jnp.float32),               # acc
          ],
      ),
      out_shape=jax.ShapeDtypeStruct(qh.shape, q.dtype),
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel")),
      interpret=pltpu.InterpretParams() if interpret else False,
  )(kv_lens, page_indices.reshape(-1), cu_q_lens, num_seqs, qh, k_pages,
    v_pages)
  out = out.reshape(num_kv_heads, padded, group, head_dim).transpose(1, 0, 2, 3)
  return out.reshape(padded, num_heads, head_dim)[:tokens]
