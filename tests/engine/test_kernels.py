"""Pallas paged-attention kernels against their dense jnp references, in interpret mode on CPU.

Every (page_size, head_dim, GQA, dtype) combination runs each kernel over a batch holding the
awkward lengths 1, page_size - 1, page_size, page_size + 1 and a long one, with pages in a random
permuted order. Interpret mode fills outputs with NaN before the kernel runs (and TPU interpret
mode is asked to poison uninitialised memory), so a row the kernel forgets to write fails.
"""

import itertools
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels_pallas
from helpers.kernel_cases import TOLERANCE, awkward_lengths, decode_case, ragged_case

PAGE_SIZES, HEAD_DIMS, GQAS, DTYPES = (8, 16, 32), (64, 128), (1, 4, 8), (jnp.float32,
                                                                         jnp.bfloat16)
PRODUCT = list(itertools.product(PAGE_SIZES, HEAD_DIMS, GQAS, DTYPES))
# TPU interpret mode simulates DMAs and semaphores and is slow on CPU (~7 s a case): the default
# run covers every page size, head dim, GQA ratio and dtype in a subset; the rest of the product
# is marked tpu_full, deselected by default (pyproject addopts), run with `pytest -m tpu_full`.
TPU_SUBSET = [(8, 64, 1, jnp.float32), (16, 128, 4, jnp.bfloat16), (32, 64, 8, jnp.float32),
              (8, 128, 8, jnp.bfloat16), (16, 64, 1, jnp.float32), (32, 128, 4, jnp.float32)]


def _ids(cases):
  return [f"ps{p}-d{d}-g{g}-{jnp.dtype(t).name}" for p, d, g, t in cases]


def _variant_cases():
  # the fast tier (`-m "not slow"`) runs the subset in both variants, CI the GPU product too
  cases = [pytest.param("gpu", *c, id="gpu-" + i,
                        marks=() if c in TPU_SUBSET else (pytest.mark.slow,))
           for c, i in zip(PRODUCT, _ids(PRODUCT))]
  for c, i in zip(PRODUCT, _ids(PRODUCT)):
    marks = () if c in TPU_SUBSET else (pytest.mark.slow, pytest.mark.tpu_full)
    cases.append(pytest.param("tpu", *c, id="tpu-" + i, marks=marks))
  return cases


def _seed(*case) -> int:
  """A different, reproducible seed per case (Python's hash() is salted per process)."""
  return zlib.crc32(repr(case).encode())


def _assert_close(out, ref, dtype):
  out, ref = np.asarray(out, np.float32), np.asarray(ref, np.float32)
  assert not np.isnan(out).any(), "kernel left rows unwritten (NaN poison survived)"
  np.testing.assert_allclose(out, ref, **TOLERANCE[dtype])


@pytest.mark.parametrize("variant,page_size,head_dim,gqa,dtype", _variant_cases())
def test_decode_kernel_matches_reference(variant, page_size, head_dim, gqa, dtype):
  args = decode_case(_seed(variant, page_size, head_dim, gqa, dtype),
                     lengths=awkward_lengths(page_size), page_size=page_size,
                     head_dim=head_dim, num_kv_heads=2, gqa=gqa, dtype=dtype)
  out = kernels_pallas.paged_attention(*args, interpret=True, variant=variant)
  assert out.shape == args[0].shape and out.dtype == dtype
  _assert_close(out, kernels_pallas.paged_attention_reference(*args), dtype)


@pytest.mark.parametrize("variant,page_size,head_dim,gqa,dtype", _variant_cases())
def test_ragged_kernel_matches_reference(variant, page_size, head_dim, gqa, dtype):
  # One decode row, a prefill from scratch, a chunk after a cached prefix, awkward lengths;
  # a padding sequence and 5 padding query rows past the last valid one.
  lengths = awkward_lengths(page_size, long=200)
  q_lens = [1, lengths[1], lengths[2], 17, lengths[4]]
  kv_lens = [lengths[3], lengths[1], lengths[2], 17 + page_size + 3, lengths[4]]
  args = ragged_case(_seed("ragged", variant, page_size, head_dim, gqa, dtype), q_lens=q_lens,
                     kv_lens=kv_lens, page_size=page_size, head_dim=head_dim, num_kv_heads=2,
                     gqa=gqa, dtype=dtype, max_seqs=6, pad_tokens=5)
  out = kernels_pallas.ragged_paged_attention(*args, interpret=True, variant=variant)
  ref = kernels_pallas.ragged_paged_attention_reference(*args)
  assert out.shape == args[0].shape and out.dtype == dtype
  _assert_close(out, ref, dtype)
  np.testing.assert_array_equal(np.asarray(out[-5:], np.float32), 0.0)


@pytest.mark.parametrize("variant", ["gpu", "tpu"])
def test_ragged_all_decode_rows_equals_decode_kernel(variant):
  """A ragged batch of q_len = 1 rows is decode: both kernels must agree with each other."""
  q, k, v, lengths, table = decode_case(7, lengths=[3, 16, 17, 40], page_size=16, head_dim=64,
                                        num_kv_heads=2, gqa=4, dtype=jnp.float32)
  cu = jnp.arange(5, dtype=jnp.int32)
  ragged = kernels_pallas.ragged_paged_attention(q, k, v, lengths, table, cu,
                                                 jnp.array([4], jnp.int32), interpret=True,
                                                 variant=variant)
  decode = kernels_pallas.paged_attention(q, k, v, lengths, table, interpret=True,
                                          variant=variant)
  np.testing.assert_allclose(np.asarray(ragged), np.asarray(decode), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("page_size,head_dim,gqa", [(16, 64, 8), (16, 128, 4), (32, 128, 1)])
def test_decode_matches_jax_pallas_gpu_op(page_size, head_dim, gqa):
  """Second oracle: JAX's own Pallas GPU paged_attention (same page layout), interpret mode."""
  from jax.experimental.pallas.ops.gpu import paged_attention as jax_paged
  args = decode_case(11, lengths=[1, 15, 33, 130], page_size=page_size, head_dim=head_dim,
                     num_kv_heads=2, gqa=gqa, dtype=jnp.float32)
  q, k, v, lengths, table = args
  theirs = jax_paged.paged_attention(q * head_dim ** -0.5, k, v, table, lengths,
                                     k_splits=1, pages_per_compute_block=1, interpret=True)
  ours = kernels_pallas.paged_attention(*args, interpret=True, variant="gpu")
  np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=2e-5, rtol=2e-5)


def test_kernels_jit_with_explicit_scale():
  args = decode_case(3, lengths=[5, 9], page_size=8, head_dim=64, num_kv_heads=2, gqa=2,
                     dtype=jnp.float32)
  fn = jax.jit(lambda *a: kernels_pallas.paged_attention(*a, sm_scale=0.3, interpret=True,
                                                         pages_per_compute_block=1))
  np.testing.assert_allclose(np.asarray(fn(*args)),
                             np.asarray(kernels_pallas.paged_attention_reference(*args,
                                                                                 sm_scale=0.3)),
                             atol=2e-5, rtol=2e-5)


BAD_DECODE = [
    (lambda a: (a[0][0],) + a[1:], "q: expected [batch, num_heads, head_dim], got shape (8, 64)"),
    (lambda a: (a[0], a[1][:, :, :, :32]) + a[2:],
     "v_pages: shape (2, 13, 8, 64) differs from k_pages (2, 13, 8, 32)"),
    (lambda a: (a[0], a[1][..., :32], a[2][..., :32]) + a[3:],
     "k_pages: head_dim 32 differs from q's head_dim 64"),
    (lambda a: a[:3] + (a[3].astype(jnp.float32),) + a[4:],
     "lengths: expected dtype int32, got float32"),
    (lambda a: a[:4] + (a[4][:1],), "page_indices: expected shape [batch, pages_per_seq] = "
                                    "(2, 4), got (1, 4)"),
    (lambda a: (a[0].astype(jnp.float16),) + a[1:],
     "q: expected dtype float32 or bfloat16, got float16"),
    (lambda a: (a[0][:, :3],) + a[1:], "q: num_heads 3 is not a multiple of num_kv_heads 2"),
]


@pytest.mark.parametrize("mutate,message", BAD_DECODE)
def test_decode_validation_names_the_argument(mutate, message):
  args = decode_case(0, lengths=[5, 20], page_size=8, head_dim=64, num_kv_heads=2, gqa=4,
                     dtype=jnp.float32)
  with pytest.raises(ValueError) as e:
    kernels_pallas.paged_attention(*mutate(args), interpret=True)
  assert str(e.value) == message


def test_ragged_validation_names_the_argument():
  args = ragged_case(0, q_lens=[3, 4], kv_lens=[3, 9], page_size=8, head_dim=64,
                     num_kv_heads=2, gqa=2, dtype=jnp.float32, max_seqs=3)
  with pytest.raises(ValueError) as e:
    kernels_pallas.ragged_paged_attention(*args[:5], args[5][:3], args[6], interpret=True)
  assert str(e.value) == "cu_q_lens: expected shape [max_seqs + 1] = (4,), got (3,)"
  with pytest.raises(ValueError) as e:
    kernels_pallas.ragged_paged_attention(*args[:6], jnp.array([2, 0], jnp.int32),
                                          interpret=True)
  assert str(e.value) == "num_seqs: expected shape [1] = (1,), got (2,)"


def test_cpu_without_interpret_is_a_clear_error():
  args = decode_case(0, lengths=[5], page_size=8, head_dim=64, num_kv_heads=2, gqa=1,
                     dtype=jnp.float32)
  with pytest.raises(ValueError) as e:
    kernels_pallas.paged_attention(*args)
  assert str(e.value) == ("interpret: Pallas kernels need a TPU or GPU; on cpu pass "
                          "interpret=True")
