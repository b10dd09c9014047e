"""XLA paged attention scaling: cost follows the context in use, not kv.max_model_len.

  python benchmarks/attention_scaling.py

Compares kernels_pallas.xla_attention (blocked, online softmax over the pages a sequence has)
with the gather-everything implementation it replaced (copied below as `old_*`), one attention
call of one layer, on the default JAX backend (CPU here). Prints two markdown tables:

  decode: batch 4, 8 q heads / 2 kv heads, head_dim 64, page_size 16, float32, block tables of
    2048 pages (max_model_len 32768); median wall time of REPEATS jitted calls after a warm-up,
    at actual contexts 512..8192.
  prefill: one 4096-token sequence (max_seqs 4), same heads; the compiled executable's temp
    bytes (memory_analysis) against the bytes of K and V it reads, at two max_model_len values.
    The old implementation is compiled only (at 32768 it would need ~128 GiB to run).
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from kernels_pallas import xla_attention

BATCH, HEADS, KV_HEADS, HEAD_DIM, PAGE_SIZE = 4, 8, 2, 64, 16
MAX_MODEL_LEN = 32768
CONTEXTS = (512, 1024, 2048, 4096, 8192)
PREFILL_TOKENS, PREFILL_MAX_SEQS = 4096, 4
REPEATS = 5


# --- The previous implementation, verbatim in substance: the peer being measured. ------------

def _old_softmax_attend(scores, mask, v, spec):
  scores = jnp.where(mask, scores, -jnp.inf)
  probs = jnp.where(mask, jax.nn.softmax(scores, axis=-1), 0.0)
  return jnp.einsum(spec, probs, v.astype(jnp.float32))


def old_paged_attention_xla(q, k_pages, v_pages, lengths, page_indices):
  """Gathers [KVH, B, max_model_len, D] per call."""
  b, h, d = q.shape
  kvh = k_pages.shape[0]
  k = k_pages[:, page_indices].reshape(kvh, b, -1, d)
  v = v_pages[:, page_indices].reshape(kvh, b, -1, d)
  qg = q.reshape(b, kvh, h // kvh, d).astype(jnp.float32)
  scores = jnp.einsum("bkgd,kbld->bkgl", qg, k.astype(jnp.float32)) * d ** -0.5
  mask = jnp.arange(k.shape[2])[None, :] < lengths[:, None]
  v = jnp.where(mask[None, :, :, None], v, 0)
  out = _old_softmax_attend(scores, mask[:, None, None, :], v, "bkgl,kbld->bkgd")
  return out.reshape(b, h, d).astype(q.dtype)


def old_ragged_paged_attention_xla(q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens,
                                   num_seqs):
  """Gathers [KVH, T, max_model_len, D] per call."""
  t, h, d = q.shape
  kvh = k_pages.shape[0]
  max_seqs = page_indices.shape[0]
  token = jnp.arange(t)
  seq = jnp.minimum(jnp.searchsorted(cu_q_lens[1:], token, side="right"), max_seqs - 1)
  valid = token < cu_q_lens[num_seqs[0]]
  q_lens = cu_q_lens[1:] - cu_q_lens[:-1]
  q_pos = kv_lens[seq] - q_lens[seq] + (token - cu_q_lens[seq])
  k = k_pages[:, page_indices[seq]].reshape(kvh, t, -1, d)
  v = v_pages[:, page_indices[seq]].reshape(kvh, t, -1, d)
  mask = (jnp.arange(k.shape[2])[None, :] <= q_pos[:, None]) & valid[:, None]
  v = jnp.where(mask[None, :, :, None], v, 0)
  qg = q.reshape(t, kvh, h // kvh, d).astype(jnp.float32)
  scores = jnp.einsum("tkgd,ktld->tkgl", qg, k.astype(jnp.float32)) * d ** -0.5
  out = _old_softmax_attend(scores, mask[:, None, None, :], v, "tkgl,ktld->tkgd")
  return out.reshape(t, h, d).astype(q.dtype)


# --- Inputs and measurements. ----------------------------------------------------------------

def _pools(rng, total_pages):
  shape = (KV_HEADS, total_pages, PAGE_SIZE, HEAD_DIM)
  return (jnp.asarray(rng.standard_normal(shape), jnp.float32),
          jnp.asarray(rng.standard_normal(shape), jnp.float32))


def _table(rng, rows, used_pages, total_pages):
  """[rows, max_model_len / page_size]: `used_pages` distinct pages each, the rest page 0."""
  table = np.zeros((rows, MAX_MODEL_LEN // PAGE_SIZE), np.int32)
  table[:, :used_pages] = rng.permutation(total_pages)[:rows * used_pages].reshape(rows, -1)
  return jnp.asarray(table)


def _median_s(fn, *args) -> float:
  jax.block_until_ready(fn(*args))                  # compile + warm-up
  times = []
  for _ in range(REPEATS):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def decode_table() -> None:
  rng = np.random.default_rng(0)
  used = max(CONTEXTS) // PAGE_SIZE
  k_pages, v_pages = _pools(rng, BATCH * used + 1)
  q = jnp.asarray(rng.standard_normal((BATCH, HEADS, HEAD_DIM)), jnp.float32)
  table = _table(rng, BATCH, used, BATCH * used + 1)
  old, new = jax.jit(old_paged_attention_xla), jax.jit(xla_attention.paged_attention_xla)
  print(f"decode: batch {BATCH}, {HEADS} q / {KV_HEADS} kv heads, head_dim {HEAD_DIM}, "
        f"page_size {PAGE_SIZE}, max_model_len {MAX_MODEL_LEN}, median of {REPEATS}\n")
  print("| context | old (ms) | new (ms) | old / new | max abs diff |")
  print("|--:|--:|--:|--:|--:|")
  for ctx in CONTEXTS:
    lengths = jnp.full((BATCH,), ctx, jnp.int32)
    args = (q, k_pages, v_pages, lengths, table)
    t_old, t_new = _median_s(old, *args), _median_s(new, *args)
    diff = float(jnp.max(jnp.abs(old(*args) - new(*args))))
    print(f"| {ctx} | {t_old * 1e3:.2f} | {t_new * 1e3:.2f} | {t_old / t_new:.1f}x | "
          f"{diff:.1e} |")


def _temp_bytes(fn, *args) -> int:
  return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def prefill_table() -> None:
  rng = np.random.default_rng(1)
  used = PREFILL_TOKENS // PAGE_SIZE
  k_pages, v_pages = _pools(rng, PREFILL_MAX_SEQS * used + 1)
  q = jnp.asarray(rng.standard_normal((PREFILL_TOKENS, HEADS, HEAD_DIM)), jnp.float32)
  kv_lens = jnp.asarray([PREFILL_TOKENS] + [0] * (PREFILL_MAX_SEQS - 1), jnp.int32)
  cu = jnp.asarray([0] + [PREFILL_TOKENS] * PREFILL_MAX_SEQS, jnp.int32)
  kv_read = 2 * PREFILL_TOKENS * KV_HEADS * HEAD_DIM * 4            # K and V, float32
  q_bytes = q.size * 4
  print(f"\nprefill: {PREFILL_TOKENS} tokens, one sequence, max_seqs {PREFILL_MAX_SEQS}; KV read "
        f"{kv_read / 2**20:.1f} MiB (q itself: {q_bytes / 2**20:.1f} MiB); temp = compiled "
        "memory_analysis().temp_size_in_bytes\n")
  print("| max_model_len | old temp (MiB) | new temp (MiB) | old / KV | new / KV | new time (s) |")
  print("|--:|--:|--:|--:|--:|--:|")
  for max_len in (8192, MAX_MODEL_LEN):
    table = _table(rng, PREFILL_MAX_SEQS, used, PREFILL_MAX_SEQS * used + 1)
    table = table[:, :max_len // PAGE_SIZE]
    args = (q, k_pages, v_pages, kv_lens, table, cu, jnp.asarray([1], jnp.int32))
    old_b = _temp_bytes(old_ragged_paged_attention_xla, *args)
    new_b = _temp_bytes(xla_attention.ragged_paged_attention_xla, *args)
    t_new = _median_s(jax.jit(xla_attention.ragged_paged_attention_xla), *args)
    print(f"| {max_len} | {old_b / 2**20:,.0f} | {new_b / 2**20:.1f} | {old_b / kv_read:,.0f}x "
          f"| {new_b / kv_read:.1f}x | {t_new:.2f} |")


if __name__ == "__main__":
  print(f"backend: {jax.default_backend()}, {jax.device_count()} device(s)\n")
  decode_table()
  prefill_table()
