"""XLA (jnp) attention over the paged KV cache: the kernels' XLA implementation, CPU default.

One page layout per layer: `k_pages`, `v_pages` of shape `[num_kv_heads, total_pages,
page_size, head_dim]`. `paged_attention_xla` / `ragged_paged_attention_xla` take the same
arguments as the Pallas kernels beside them, so the model swaps implementations through
`attention_ops.AttentionOps` without knowing which runs. Unlike the `reference.py` oracles
these are jittable and GSPMD-partitionable (the serving path). Grouped-query attention: query
head h reads kv head h // (H / KVH).

Both walk the pages a sequence actually has, a block of pages at a time, with an online
(flash-attention) softmax carried in float32: a `lax.fori_loop` whose trip count is the batch's
longest sequence in blocks, a traced value. Memory and time scale with the context in use, not
with the block table's width (`kv.max_model_len`); every shape stays static, so the functions
jit, partition under GSPMD (kv heads) and run per shard under shard_map.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

# Keys per block: a static size, independent of pages_per_seq (so a wider block table changes
# nothing but its own padding). Decode: the scores of a block are [B, H, tokens], small; a
# block is read whole whatever the context, so a short context pays for up to a block of
# padding: at 128 tokens a batch-4 SmolLM2 step on a 2-core CPU is 15-20% faster than at 512
# (context 128 of max_model_len 1024), and no slower at context 900 (BENCHMARKS.md, issue 28).
_DECODE_BLOCK_TOKENS = 128
# Ragged: the scores of a block are [rows, H, tokens] over every query row at once; the block
# shrinks as rows grow so that they stay near this many float32 elements (8 MiB).
_RAGGED_SCORE_ELEMENTS = 1 << 21
_RAGGED_BLOCK_TOKENS = (32, 512)   # clamp, before rounding to whole pages
_MAX_Q_TILE = 128                  # query rows per tile of one sequence
_MULTIPLY_ROWS_MAX = 8             # tiles of at most this many rows: no dots (see _scores)


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


def _pow2_floor(n: int) -> int:
  return 1 << (max(int(n), 1).bit_length() - 1)


def _layer_pages(pages, layer, idx):
  """pages[:, idx] of one layer -> [KVH, *idx.shape, ps, D]. `pages` is one layer's
  [KVH, P, ps, D] when layer is None, else a whole pool [L, KVH, P, ps, D]: then one gather
  takes the layer and the pages together, inside the block loop. (A slice of the layer first
  is loop-invariant, so XLA hoists it out of the loop and copies the whole layer.)"""
  if layer is None:
    return pages[:, idx]
  return jnp.moveaxis(pages[layer, :, idx], idx.ndim, 0)


def _multiply(rows: int) -> bool:
  """Whether a tile of `rows` query rows attends without dots: few rows, on the CPU (TPU and
  GPU run small dots on their matrix units)."""
  return rows <= _MULTIPLY_ROWS_MAX and jax.default_backend() == "cpu"


def _scores(qt, k):
  """[KVH, W, R, D] x [KVH, W, L, D] -> [KVH, W, R, L]. A decode tile has R = the GQA group
  (a few rows): as a batched dot that is KVH * W tiny matmuls, which XLA on CPU runs one by one
  (about 2x the time of the same math as a fused multiply and reduce; 64 sequences of
  SmolLM2: 30 layers' attention 100 -> 79 ms). Prefill tiles (many rows) stay dots."""
  if _multiply(qt.shape[2]):
    return jnp.sum(qt[:, :, :, None, :] * k[:, :, None, :, :], axis=-1)
  return jnp.einsum("kwrd,kwld->kwrl", qt, k)


def _weighted(p, v):
  """[KVH, W, R, L] x [KVH, W, L, D] -> [KVH, W, R, D] (as _scores: few rows, no dot)."""
  if _multiply(p.shape[2]):
    return jnp.sum(p[..., None] * v[:, :, None, :, :], axis=-2)
  return jnp.einsum("kwrl,kwld->kwrd", p, v)


def _attend_blocks(qt, q_pos, kv_len, tables, k_pages, v_pages, max_kv, pages_per_block, scale,
                   layer=None):
  """Online-softmax attention of query tiles over their own sequences' pages, block by block.

  Args:
    qt: float32 [KVH, W, R, D], W tiles of R query rows each (R = tile rows * GQA group).
    q_pos: int32 [W, R], each row's absolute position; keys at positions <= it are attended;
      -1 for a padding row (attends to nothing, returns zeros).
    kv_len: int32 [W], tokens of the tile's sequence (0 for a padding tile); V slots at or past
      it are zeroed before the matmul: stale pages may hold NaN, and 0 * NaN = NaN.
    tables: int32 [W, cols], the tile's sequence's block table, cols a multiple of the block.
    max_kv: int32 scalar, the longest kv_len: the loop runs ceil(max_kv / block) times.
    layer: None (k_pages, v_pages are one layer's [KVH, P, ps, D]) or an int32 scalar
      (they are whole pools [L, KVH, P, ps, D]; see _layer_pages).
  Returns:
    float32 [KVH, W, R, D], normalised; rows with no valid key are zeros.
  """
  kvh, w, r, d = qt.shape
  page_size = k_pages.shape[-2]
  block = pages_per_block * page_size
  num_blocks = jnp.minimum(-(-max_kv // block), tables.shape[1] // pages_per_block)

  def body(i, carry):
    m, l, acc = carry                                      # [KVH, W, R] x2, [KVH, W, R, D]
    idx = lax.dynamic_slice_in_dim(tables, i * pages_per_block, pages_per_block, axis=1)
    k = _layer_pages(k_pages, layer, idx).reshape(kvh, w, block, d).astype(jnp.float32)
    v = _layer_pages(v_pages, layer, idx).reshape(kvh, w, block, d).astype(jnp.float32)
    pos = i * block + jnp.arange(block)                                 # [blk]
    v = jnp.where((pos[None, :] < kv_len[:, None])[None, :, :, None], v, 0.0)
    mask = pos[None, None, :] <= q_pos[:, :, None]                      # [W, R, blk]
    s = _scores(qt, k) * scale
    s = jnp.where(mask[None], s, -jnp.inf)
    m_new = jnp.maximum(m, s.max(axis=-1))
    m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)   # no valid key yet: exp(-inf) = 0
    p = jnp.exp(s - m_safe[..., None])
    corr = jnp.exp(m - m_safe)
    l = l * corr + p.sum(axis=-1)
    acc = acc * corr[..., None] + _weighted(p, v)
    return m_new, l, acc

  init = (jnp.full((kvh, w, r), -jnp.inf, jnp.float32), jnp.zeros((kvh, w, r), jnp.float32),
          jnp.zeros((kvh, w, r, d), jnp.float32))
  if tables.shape[1] == pages_per_block:   # one block holds every table: no loop to run
    _, l, acc = body(0, init)
  else:
    _, l, acc = lax.fori_loop(0, num_blocks, body, init)
  return jnp.where(l[..., None] > 0, acc / jnp.where(l > 0, l, 1.0)[..., None], 0.0)


def _block_pages(block_tokens: int, page_size: int, pages_per_seq: int) -> int:
  """Pages per block: block_tokens' worth, but never more than a block table holds (a short
  max_model_len would otherwise gather a block of padding pages every step)."""
  return max(1, min(block_tokens // page_size, pages_per_seq))


def _padded_tables(page_indices, pages_per_block):
  """Pads the block table's columns (with page 0, never read unmasked) to whole blocks."""
  pad = -page_indices.shape[1] % pages_per_block
  return jnp.pad(page_indices, ((0, 0), (0, pad))) if pad else page_indices


def paged_attention_xla(q, k_pages, v_pages, lengths, page_indices, *, sm_scale=None,
                        layer=None):
  """Decode attention: one query token per sequence over its cached tokens.

  Args:
    q: [B, H, D], the query of the newest token of each sequence.
    k_pages, v_pages: [KVH, P, page_size, D], or whole pools [L, KVH, P, page_size, D] with
      `layer` (an int32 scalar) naming the layer to read (no copy of that layer is made).
    lengths: int32 [B], tokens in the cache for each sequence (the newest included), >= 1.
    page_indices: int32 [B, pages_per_seq], each sequence's block table (padded).
  Returns:
    [B, H, D] in q's dtype.
  """
  b, h, d = q.shape
  kvh, _, page_size, _ = k_pages.shape[-4:]
  g = h // kvh
  scale = d ** -0.5 if sm_scale is None else sm_scale
  pages_per_block = _block_pages(_DECODE_BLOCK_TOKENS, page_size, page_indices.shape[1])
  tables = _padded_tables(page_indices, pages_per_block)
  qt = q.reshape(b, kvh, g, d).transpose(1, 0, 2, 3).astype(jnp.float32)   # [KVH, B, G, D]
  q_pos = jnp.broadcast_to((lengths - 1)[:, None], (b, g))
  out = _attend_blocks(qt, q_pos, lengths, tables, k_pages, v_pages, jnp.max(lengths),
                       pages_per_block, scale, layer)                      # [KVH, B, G, D]
  return out.transpose(1, 0, 2, 3).reshape(b, h, d).astype(q.dtype)


def _ragged_tiles(t, max_seqs, cu_q_lens, num_seqs, q_tile):
  """Splits each valid sequence's query rows into tiles of q_tile rows (the last one partial).

  W = t // q_tile + min(max_seqs, t) tiles always suffice: sum(ceil(q_s / tile)) <= t // tile +
  (number of non-empty sequences). Returns (tile_seq [W], tile_used [W], tile_start [S]).
  """
  seq_ok = jnp.arange(max_seqs) < num_seqs[0]
  q_lens = jnp.where(seq_ok, cu_q_lens[1:] - cu_q_lens[:-1], 0)           # [S]
  n_tiles = -(-q_lens // q_tile)
  tile_end = jnp.cumsum(n_tiles)
  tile_start = tile_end - n_tiles
  w = jnp.arange(t // q_tile + min(max_seqs, t))
  tile_seq = jnp.minimum(jnp.searchsorted(tile_end, w, side="right"), max_seqs - 1)
  return tile_seq, w < tile_end[-1], tile_start


def ragged_paged_attention_xla(q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens,
                               num_seqs, *, sm_scale=None, layer=None):
  """Causal attention for a packed batch of query tokens (prefill, chunked prefill, mixed).

  Sequence s owns query rows cu_q_lens[s]:cu_q_lens[s+1]; they are the last q_len positions of
  its kv_lens[s] tokens, so a prefix already in the cache is attended to.

  Each sequence's rows are cut into tiles of a static size; every tile walks its own sequence's
  pages (a [tiles, block] gather per step, never [T, max_model_len]), all tiles at once.

  Args:
    q: [T, H, D], packed new query tokens (padded to a bucket).
    k_pages, v_pages: [KVH, P, page_size, D] (the new tokens are already written), or whole
      pools [L, ...] with `layer` (as paged_attention_xla).
    kv_lens: int32 [S], page_indices: int32 [S, pages_per_seq], cu_q_lens: int32 [S + 1],
    num_seqs: int32 [1]; only the first num_seqs sequences are valid.
  Returns:
    [T, H, D] in q's dtype; padding rows are zeros.
  """
  t, h, d = q.shape
  kvh, _, page_size, _ = k_pages.shape[-4:]
  g = h // kvh
  max_seqs = page_indices.shape[0]
  scale = d ** -0.5 if sm_scale is None else sm_scale
  # Static sizes from static shapes: tiles of at most T / S rows (padding rows <= T); blocks
  # sized so that the scores of all rows stay near _RAGGED_SCORE_ELEMENTS.
  q_tile = min(_MAX_Q_TILE, _pow2_floor(max(1, t // max_seqs)))
  tile_seq, tile_used, tile_start = _ragged_tiles(t, max_seqs, cu_q_lens, num_seqs, q_tile)
  num_tiles = tile_seq.shape[0]
  lo, hi = _RAGGED_BLOCK_TOKENS
  block = min(hi, max(lo, _pow2_floor(_RAGGED_SCORE_ELEMENTS // (num_tiles * q_tile * h))))
  pages_per_block = _block_pages(block, page_size, page_indices.shape[1])

  q_lens = cu_q_lens[1:] - cu_q_lens[:-1]
  local = (jnp.arange(num_tiles) - tile_start[tile_seq]) * q_tile        # [W] first row
  rows = cu_q_lens[tile_seq][:, None] + local[:, None] + jnp.arange(q_tile)   # [W, tq] tokens
  row_ok = tile_used[:, None] & (rows < cu_q_lens[tile_seq + 1][:, None])
  q_pos = kv_lens[tile_seq][:, None] - q_lens[tile_seq][:, None] + local[:, None] + jnp.arange(
      q_tile)
  q_pos = jnp.repeat(jnp.where(row_ok, q_pos, -1), g, axis=1)             # [W, tq * G]
  tile_kv = jnp.where(tile_used, kv_lens[tile_seq], 0)                    # [W]
  qt = q[jnp.minimum(rows, t - 1)].astype(jnp.float32)                    # [W, tq, H, D]
  qt = qt.reshape(num_tiles, q_tile, kvh, g, d).transpose(2, 0, 1, 3, 4)
  qt = qt.reshape(kvh, num_tiles, q_tile * g, d)                          # [KVH, W, tq*G, D]
  tables = _padded_tables(page_indices, pages_per_block)[tile_seq]        # [W, cols]
  seq_ok = jnp.arange(max_seqs) < num_seqs[0]
  max_kv = jnp.max(jnp.where(seq_ok, kv_lens, 0))
  out = _attend_blocks(qt, q_pos, tile_kv, tables, k_pages, v_pages, max_kv, pages_per_block,
                       scale, layer)                                       # [KVH, W, tq*G, D]
  out = out.reshape(kvh, num_tiles * q_tile, g, d)

  # Back to packed rows: token -> (its sequence's tile, row in the tile).
  token = jnp.arange(t)
  seq = jnp.minimum(jnp.searchsorted(cu_q_lens[1:], token, side="right"), max_seqs - 1)
  offset = token - cu_q_lens[seq]
  src = jnp.minimum((tile_start[seq] + offset // q_tile) * q_tile + offset % q_tile,
                    num_tiles * q_tile - 1)
  valid = token < cu_q_lens[num_seqs[0]]
  out = jnp.where(valid[None, :, None, None], out[:, src], 0.0)           # [KVH, T, G, D]
  return out.transpose(1, 0, 2, 3).reshape(t, h, d).astype(q.dtype)


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
