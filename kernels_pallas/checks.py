"""Argument validation shared by the public kernels: ValueErrors that name the argument."""

from __future__ import annotations

import jax.numpy as jnp

FLOAT_DTYPES = (jnp.float32, jnp.bfloat16)


def _fail(name: str, what: str) -> None:
  raise ValueError(f"{name}: {what}")


def _check_int_array(name: str, x, shape: tuple, shape_doc: str) -> None:
  if tuple(x.shape) != shape:
    _fail(name, f"expected shape {shape_doc} = {shape}, got {tuple(x.shape)}")
  if x.dtype != jnp.int32:
    _fail(name, f"expected dtype int32, got {x.dtype}")


def check_q_and_pages(q, k_pages, v_pages, q_doc: str) -> tuple[int, int, int, int, int]:
  """Returns (num_heads, head_dim, num_kv_heads, total_pages, page_size)."""
  if q.ndim != 3:
    _fail("q", f"expected {q_doc}, got shape {tuple(q.shape)}")
  if k_pages.ndim != 4:
    _fail("k_pages", "expected [num_kv_heads, total_pages, page_size, head_dim], "
          f"got shape {tuple(k_pages.shape)}")
  if tuple(v_pages.shape) != tuple(k_pages.shape):
    _fail("v_pages", f"shape {tuple(v_pages.shape)} differs from k_pages {tuple(k_pages.shape)}")
  for name, x in (("q", q), ("k_pages", k_pages), ("v_pages", v_pages)):
    if x.dtype not in FLOAT_DTYPES:
      _fail(name, f"expected dtype float32 or bfloat16, got {x.dtype}")
  if v_pages.dtype != k_pages.dtype:
    _fail("v_pages", f"dtype {v_pages.dtype} differs from k_pages {k_pages.dtype}")
  num_heads, head_dim = q.shape[1], q.shape[2]
  num_kv_heads, total_pages, page_size, kv_head_dim = k_pages.shape
  if kv_head_dim != head_dim:
    _fail("k_pages", f"head_dim {kv_head_dim} differs from q's head_dim {head_dim}")
  if num_heads % num_kv_heads:
    _fail("q", f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
  return num_heads, head_dim, num_kv_heads, total_pages, page_size


def check_decode_args(q, k_pages, v_pages, lengths, page_indices, pages_per_compute_block):
  check_q_and_pages(q, k_pages, v_pages, "[batch, num_heads, head_dim]")
  batch = q.shape[0]
  if page_indices.ndim != 2:
    _fail("page_indices", f"expected [batch, pages_per_seq], got shape {tuple(page_indices.shape)}")
  _check_int_array("lengths", lengths, (batch,), "[batch]")
  _check_int_array("page_indices", page_indices, (batch, page_indices.shape[1]),
                   "[batch, pages_per_seq]")
  if pages_per_compute_block is not None and pages_per_compute_block < 1:
    _fail("pages_per_compute_block", f"must be >= 1, got {pages_per_compute_block}")


def check_ragged_args(q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, num_seqs):
  check_q_and_pages(q, k_pages, v_pages, "[total_q_tokens, num_heads, head_dim]")
  if kv_lens.ndim != 1:
    _fail("kv_lens", f"expected [max_seqs], got shape {tuple(kv_lens.shape)}")
  max_seqs = kv_lens.shape[0]
  _check_int_array("kv_lens", kv_lens, (max_seqs,), "[max_seqs]")
  if page_indices.ndim != 2:
    _fail("page_indices", f"expected [max_seqs, pages_per_seq], got shape "
          f"{tuple(page_indices.shape)}")
  _check_int_array("page_indices", page_indices, (max_seqs, page_indices.shape[1]),
                   "[max_seqs, pages_per_seq]")
  _check_int_array("cu_q_lens", cu_q_lens, (max_seqs + 1,), "[max_seqs + 1]")
  _check_int_array("num_seqs", num_seqs, (1,), "[1]")
