"""Ragged paged attention on GPU (Pallas, Triton lowering): prefill, chunked, mixed.

The query rows of a batch are the concatenation of every sequence's new tokens; sequence s
owns rows cu_q_lens[s]:cu_q_lens[s + 1], which are the last q_len positions of its kv_len
cached tokens (so a chunked prefill also attends to the cached prefix), with causal masking.

Grid (max_seqs, num_kv_heads, q_blocks). A program takes `block_q` consecutive query tokens
of one sequence and packs all query heads of one kv head into the rows of a single tile
([block_q * group, head_dim]), so each K/V block gathered through the block table feeds
every head that shares it. The KV loop stops at the causal limit of the block's last
query; blocks entirely below the block's first query skip the causal mask. Programs past
their sequence's q_len (or past num_seqs) do nothing, and rows are stored under a mask so
neighbouring sequences are never clobbered. Rows no valid sequence owns are zeroed in the
wrapper.
"""

from __future__ import annotations

import functools

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
import jax.numpy as jnp

_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)
_TILE_ROWS = 128    # Query rows (tokens x heads of a group) per program.
_BLOCK_TOKENS = 64  # KV tokens per inner-loop block.


def _next_pow2(x: int) -> int:
  return 1 << max(0, (x - 1).bit_length())


def _prefill_kernel(
    num_seqs_ref,      # [1] int32: number of valid sequences
    cu_q_lens_ref,     # [max_seqs + 1] int32: query row offsets of the sequences
    kv_lens_ref,       # [max_seqs] int32: cached tokens per sequence (new ones included)
    page_indices_ref,  # [pages_per_seq] int32: this sequence's block table
    q_ref,             # [total_q, group, head_dim]: query heads of one kv head
    k_pages_ref,       # [total_pages, page_size, head_dim]: one kv head's key pages
    v_pages_ref,       # [total_pages, page_size, head_dim]: one kv head's value pages
    o_ref,             # [total_q, group, head_dim]: output rows of the same heads
    *,
    sm_scale: float,
    block_q: int,
    pages_per_block: int,
    precision,
):
  seq, q_block = pl.program_id(0), pl.program_id(2)
  _, group, head_dim = q_ref.shape
  page_size = k_pages_ref.shape[1]
  block_k = pages_per_block * page_size
  rows = block_q * group
  q_start = cu_q_lens_ref[seq]
  q_len = cu_q_lens_ref[seq + 1] - q_start
  kv_len = kv_lens_ref[seq]
  first = q_block * block_q  # Index, within the sequence, of the block's first query.

  @pl.when((seq < num_seqs_ref[0]) & (first < q_len))
  def _():
    tile = (block_q, group, head_dim)
    live = jnp.broadcast_to(
        (first + jnp.arange(block_q) < q_len)[:, None, None], tile)
    rows_slice = pl.ds(q_start + first, block_q)
    q = plgpu.load(q_ref.at[rows_slice], mask=live, other=0)  # [block_q, group, head_dim]
    q = q.reshape(rows, head_dim)
    first_pos = kv_len - q_len + first  # Absolute position of the block's first query.
    q_pos = first_pos + jnp.arange(rows) // group  # [rows] absolute query positions

    def body(i, carry, *, causal):
      o_prev, m_prev, l_prev = carry
      pages = page_indices_ref[pl.ds(i * pages_per_block, pages_per_block)]
      k = k_pages_ref[pages].reshape(block_k, head_dim)       # [block_k, head_dim]
      v = v_pages_ref[pages].reshape(block_k, head_dim)       # [block_k, head_dim]
      s = plgpu.dot(q, k, trans_b=True, precision=precision) * sm_scale  # [rows, block_k]
      if causal:  # Only the last blocks can reach past kv_len.
        k_pos = i * block_k + jnp.arange(block_k)
        s = jnp.where(k_pos[None, :] <= q_pos[:, None], s, _MASK_VALUE)
        # Slots past kv_len (a page's tail, table padding) may hold a previous owner's
        # NaN/inf: zero them, since a zero probability times NaN (or inf) is still NaN.
        v = jnp.where((k_pos < kv_len)[:, None], v, jnp.zeros((), v.dtype))
      m_next = jnp.maximum(m_prev, s.max(axis=1))
      alpha = jnp.exp(m_prev - m_next)
      p = jnp.exp(s - m_next[:, None])
      l_next = alpha * l_prev + p.sum(axis=1)
      pv = plgpu.dot(p.astype(v.dtype), v, precision=precision)  # [rows, head_dim]
      return alpha[:, None] * o_prev + pv, m_next, l_next

    # Blocks below the first query need no mask; the rest run up to the last query.
    num_full = (first_pos + 1) // block_k
    last_pos = kv_len - q_len + jnp.minimum(first + block_q, q_len) - 1
    num_blocks = pl.cdiv(last_pos + 1, block_k)
    carry = (jnp.zeros((rows, head_dim), jnp.float32),
             jnp.full((rows,), -jnp.inf, jnp.float32),
             jnp.zeros((rows,), jnp.float32))
    carry = lax.fori_loop(0, num_full, functools.partial(body, causal=False), carry)
    o, _, l = lax.fori_loop(num_full, num_blocks, functools.partial(body, causal=True), carry)
    out = (o / l[:, None]).reshape(tile).astype(o_ref.dtype)
    plgpu.store(o_ref.at[rows_slice], out, mask=live)


@functools.partial(jax.jit, static_argnames=("sm_scale", "interpret"))
def ragged_paged_attention_gpu(
    q: jax.Array,
    k_pages: jax.Array,
    v_pages: jax.Array,
    kv_lens: jax.Array,
    page_indices: jax.Array,
    cu_q_lens: jax.Array,
    num_seqs: jax.Array,
    *,
    sm_scale: float,
    interpret: bool = False,
) -> jax.Array:
  """Causal attention of ragged query rows over a paged KV cache.

  Args:
    q: [total_q_tokens, num_heads, head_dim] new query tokens of all sequences,
      concatenated (float32 or bfloat16).
    k_pages: [num_kv_heads, total_pages, page_size, head_dim] key pages; page_size a
      power of two >= 8. num_heads must be a multiple of num_kv_heads (query head h
      reads kv head h // (num_heads // num_kv_heads)).
    v_pages: [num_kv_heads, total_pages, page_size, head_dim] value pages.
    kv_lens: int32 [max_seqs] tokens in each sequence's cache, its new tokens included.
    page_indices: int32 [max_seqs, pages_per_seq] block tables; entries past a
      sequence's length must be valid page ids.
    cu_q_lens: int32 [max_seqs + 1] row offsets: sequence s owns rows
      cu_q_lens[s]:cu_q_lens[s + 1], its last q_len positions.
    num_seqs: int32 [1] number of valid sequences (the first num_seqs[0]).
    sm_scale: scale applied to q.k before the softmax.
    interpret: run the kernel in Pallas interpret mode (CPU testing).

  Returns:
    [total_q_tokens, num_heads, head_dim] in q's dtype, computed in float32; rows that
    no valid sequence owns are zero.
  """
  total_q, num_heads, head_dim = q.shape
  num_kv_heads, _, page_size, _ = k_pages.shape
  max_seqs, pages_per_seq = page_indices.shape
  group = num_heads // num_kv_heads
  group_p = _next_pow2(group)
  block_q = max(1, min(_TILE_ROWS // group_p, _next_pow2(total_q)))
  block_q = max(block_q, pl.cdiv(16, group_p))  # Triton dot: >= 16 rows.
  ppcb = _next_pow2(max(1, _BLOCK_TOKENS // page_size, pl.cdiv(16, page_size)))
  if pages_per_seq % ppcb:  # Whole compute blocks only: pad the block tables with page 0.
    page_indices = jnp.pad(page_indices, ((0, 0), (0, -pages_per_seq % ppcb)))

  q_grouped = q.reshape(total_q, num_kv_heads, group, head_dim)
  if group_p != group:
    q_grouped = jnp.pad(q_grouped, ((0, 0), (0, 0), (0, group_p - group), (0, 0)))
  precision = lax.Precision.HIGHEST if q.dtype == jnp.float32 else None
  num_warps = 8 if block_q * group_p >= 128 else 4

  kernel = functools.partial(
      _prefill_kernel, sm_scale=sm_scale, block_q=block_q, pages_per_block=ppcb,
      precision=precision)
  rows_spec = pl.BlockSpec((total_q, None, group_p, head_dim), lambda s, h, j: (0, h, 0, 0))
  pages_spec = pl.BlockSpec((None, *k_pages.shape[1:]), lambda s, h, j: (h, 0, 0, 0))
  out = pl.pallas_call(
      kernel,
      grid=(max_seqs, num_kv_heads, pl.cdiv(total_q, block_q)),
      in_specs=[
          pl.BlockSpec((1,), lambda s, h, j: (0,)),                            # num_seqs
          pl.BlockSpec((max_seqs + 1,), lambda s, h, j: (0,)),                 # cu_q_lens
          pl.BlockSpec((max_seqs,), lambda s, h, j: (0,)),                     # kv_lens
          pl.BlockSpec((None, page_indices.shape[1]), lambda s, h, j: (s, 0)),  # page_indices
          rows_spec,                                                           # q
          pages_spec,                                                          # k_pages
          pages_spec,                                                          # v_pages
      ],
      out_specs=rows_spec,                                                     # o
      out_shape=jax.ShapeDtypeStruct(q_grouped.shape, q.dtype),
      compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=2),
      interpret=interpret,
      name=f"ragged_paged_attention_bq{block_q}_ppcb{ppcb}",
  )(num_seqs.astype(jnp.int32), cu_q_lens.astype(jnp.int32), kv_lens.astype(jnp.int32),
    page_indices.astype(jnp.int32), q_grouped, k_pages, v_pages)

  out = out[:, :, :group].reshape(total_q, num_heads, head_dim)
  # Rows past the valid sequences are never written by the kernel: define them as zero.
  owned = jnp.arange(total_q) < cu_q_lens[num_seqs[0]]
  return jnp.where(owned[:, None, None], out, jnp.zeros((), q.dtype))
