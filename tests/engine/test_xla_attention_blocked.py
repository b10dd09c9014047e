"""The blocked XLA paged attention (kernels_pallas.xla_attention) against the dense oracles.

The XLA path walks each sequence's pages a block at a time with an online softmax, for as many
blocks as the batch's longest sequence needs: results must equal the reference.py oracles over
awkward lengths, GQA ratios, chunks after a cached prefix, padding sequences and rows, in
float32 and bfloat16; must not depend on how wide the block table is; must never let a stale
(NaN) page reach the output; and must give the same answer partitioned over kv heads.
"""

import functools
import zlib

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import kernels_pallas
from helpers.kernel_cases import TOLERANCE, awkward_lengths, decode_case, ragged_case
from kernels_pallas import xla_attention

decode_xla = jax.jit(kernels_pallas.paged_attention_xla)
ragged_xla = jax.jit(kernels_pallas.ragged_paged_attention_xla)

# (page_size, head_dim, gqa, dtype); "small" blocks are one page, so every case walks many.
CASES = [(8, 64, 1, jnp.float32), (16, 128, 4, jnp.float32), (32, 64, 8, jnp.float32),
         (16, 64, 4, jnp.bfloat16), (8, 128, 8, jnp.bfloat16)]
FAST_CASES = CASES[:2]   # the fast tier's share of the product; CI runs all of it
BLOCKS = ["small", "default"]


def _ids(cases):
  return [f"ps{p}-d{d}-g{g}-{jnp.dtype(t).name}" for p, d, g, t in cases]


def _seed(*case) -> int:
  return zlib.crc32(repr(case).encode())


@pytest.fixture
def blocks(request, monkeypatch):
  """'small': one-page blocks (the block sizes are read at trace time, so retrace)."""
  if request.param == "small":
    monkeypatch.setattr(xla_attention, "_DECODE_BLOCK_TOKENS", 1)
    monkeypatch.setattr(xla_attention, "_RAGGED_BLOCK_TOKENS", (1, 1))
  decode_xla.clear_cache()
  ragged_xla.clear_cache()
  yield request.param
  decode_xla.clear_cache()
  ragged_xla.clear_cache()


def _assert_close(out, ref, dtype):
  out, ref = np.asarray(out, np.float32), np.asarray(ref, np.float32)
  assert not np.isnan(out).any()
  np.testing.assert_allclose(out, ref, **TOLERANCE[dtype])


@functools.lru_cache(maxsize=None)
def _decode(page_size, head_dim, gqa, dtype):
  """(args, reference output) of a decode case; cached: both block sizes share it."""
  args = decode_case(_seed("decode", page_size, head_dim, gqa, dtype),
                     lengths=awkward_lengths(page_size, long=1100), page_size=page_size,
                     head_dim=head_dim, num_kv_heads=2, gqa=gqa, dtype=dtype)
  return args, kernels_pallas.paged_attention_reference(*args)


@functools.lru_cache(maxsize=None)
def _ragged(page_size, head_dim, gqa, dtype):
  """(args, reference output) of a ragged case; cached: both block sizes share it."""
  args = _ragged_args(_seed("ragged", page_size, head_dim, gqa, dtype), page_size, head_dim,
                      gqa, dtype)
  return args, _ragged_reference(*args)


def _ragged_reference(q, k_pages, v_pages, *metadata):
  """The ragged oracle as one compiled program: its host loop reads the metadata, so that is
  bound as constants and only q and the pools are traced (eagerly it compiles op by op)."""
  metadata = [np.asarray(m) for m in metadata]
  return jax.jit(lambda *a: kernels_pallas.ragged_paged_attention_reference(*a, *metadata))(
      q, k_pages, v_pages)


def _ragged_args(seed, page_size, head_dim, gqa, dtype):
  """A decode row, a prefill from scratch, a chunk after a cached prefix, awkward lengths, a
  long sequence spanning several query tiles; a padding sequence and 5 padding rows."""
  lengths = awkward_lengths(page_size, long=230)
  q_lens = [1, lengths[1], lengths[2], 17, lengths[4]]
  kv_lens = [lengths[3], lengths[1], lengths[2], 17 + page_size + 3, lengths[4] + 40]
  return ragged_case(seed, q_lens=q_lens, kv_lens=kv_lens, page_size=page_size,
                     head_dim=head_dim, num_kv_heads=2, gqa=gqa, dtype=dtype, max_seqs=6,
                     pad_tokens=5)


@pytest.mark.parametrize("blocks", BLOCKS, indirect=True)
@pytest.mark.parametrize("page_size,head_dim,gqa,dtype", [
    pytest.param(*c, id=i, marks=() if c in FAST_CASES else (pytest.mark.slow,))
    for c, i in zip(CASES, _ids(CASES))])
def test_decode_matches_reference(blocks, page_size, head_dim, gqa, dtype):
  args, ref = _decode(page_size, head_dim, gqa, dtype)
  out = decode_xla(*args)
  assert out.shape == args[0].shape and out.dtype == dtype
  _assert_close(out, ref, dtype)


@pytest.mark.parametrize("blocks", BLOCKS, indirect=True)
@pytest.mark.parametrize("page_size,head_dim,gqa,dtype", [
    pytest.param(*c, id=i, marks=() if c in FAST_CASES else (pytest.mark.slow,))
    for c, i in zip(CASES, _ids(CASES))])
def test_ragged_matches_reference(blocks, page_size, head_dim, gqa, dtype):
  args, ref = _ragged(page_size, head_dim, gqa, dtype)
  out = ragged_xla(*args)
  assert out.shape == args[0].shape and out.dtype == dtype
  _assert_close(out, ref, dtype)
  np.testing.assert_array_equal(np.asarray(out[-5:], np.float32), 0.0)


def test_ragged_decode_rows_and_tiny_buckets():
  """More sequences than tokens (one-row tiles), a padding sequence, and a ragged batch of
  q_len = 1 rows equals decode."""
  args = ragged_case(5, q_lens=[1, 1, 3], kv_lens=[9, 40, 3], page_size=8, head_dim=64,
                     num_kv_heads=2, gqa=4, dtype=jnp.float32, max_seqs=8, pad_tokens=1)
  _assert_close(ragged_xla(*args), _ragged_reference(*args), jnp.float32)
  q, k, v, lengths, table = decode_case(7, lengths=[3, 16, 17, 40], page_size=16, head_dim=64,
                                        num_kv_heads=2, gqa=4, dtype=jnp.float32)
  ragged = ragged_xla(q, k, v, lengths, table, jnp.arange(5, dtype=jnp.int32),
                      jnp.array([4], jnp.int32))
  np.testing.assert_allclose(np.asarray(ragged), np.asarray(decode_xla(q, k, v, lengths, table)),
                             atol=2e-5, rtol=2e-5)


def _largest_float_intermediate(fn, *args) -> int:
  """Elements of the biggest floating-point value in fn's jaxpr, loop bodies included."""
  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      for var in eqn.outvars:
        if jnp.issubdtype(var.aval.dtype, jnp.floating):
          yield int(np.prod(var.aval.shape))
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        yield from walk(sub)
  return max(walk(jax.make_jaxpr(fn)(*args).jaxpr))


def _widen(table, factor, rng, total_pages):
  """The same block table with (factor - 1) x more trailing columns of random pages."""
  extra = rng.integers(0, total_pages, (table.shape[0], table.shape[1] * (factor - 1)))
  return jnp.concatenate([table, jnp.asarray(extra, jnp.int32)], axis=1)


def test_cost_follows_the_longest_sequence_not_the_table_width():
  """A block is a static number of pages (capped by the table's width, so a short
  max_model_len gathers no padding pages): past that cap, widening the block table changes
  neither the result nor the largest intermediate."""
  rng = np.random.default_rng(0)
  q, k, v, lengths, table = decode_case(1, lengths=[5, 130, 700], page_size=16, head_dim=64,
                                        num_kv_heads=2, gqa=4, dtype=jnp.float32)
  wide, wider = _widen(table, 4, rng, k.shape[1]), _widen(table, 8, rng, k.shape[1])
  fn = kernels_pallas.paged_attention_xla
  assert "while" in str(jax.make_jaxpr(fn)(q, k, v, lengths, table))
  np.testing.assert_array_equal(np.asarray(decode_xla(q, k, v, lengths, wide)),
                                np.asarray(decode_xla(q, k, v, lengths, wider)))
  assert (_largest_float_intermediate(fn, q, k, v, lengths, wide)
          == _largest_float_intermediate(fn, q, k, v, lengths, wider))

  args = _ragged(*CASES[1])[0]
  wide_args = args[:4] + (_widen(args[4], 4, rng, args[1].shape[1]),) + args[5:]
  wider_args = args[:4] + (_widen(args[4], 8, rng, args[1].shape[1]),) + args[5:]
  fn = kernels_pallas.ragged_paged_attention_xla
  assert "while" in str(jax.make_jaxpr(fn)(*wide_args))
  assert "while" not in str(jax.make_jaxpr(fn)(*args))   # one block: no loop at all
  np.testing.assert_array_equal(np.asarray(ragged_xla(*wide_args)),
                                np.asarray(ragged_xla(*wider_args)))
  assert (_largest_float_intermediate(fn, *wide_args)
          == _largest_float_intermediate(fn, *wider_args))
  # A table narrower than a block makes a smaller block, not a padded one.
  assert (_largest_float_intermediate(fn, *args)
          < _largest_float_intermediate(fn, *wide_args))


def _poison_unused(k_pages, v_pages, kv_lens, table):
  """NaN in every slot that is not one of the first kv_lens[s] tokens of a sequence."""
  kvh, total, page_size, d = k_pages.shape
  used = np.zeros(total * page_size, bool)
  for n, row in zip(np.asarray(kv_lens), np.asarray(table)):
    slots = row[np.arange(n) // page_size] * page_size + np.arange(n) % page_size
    used[slots] = True
  keep = jnp.asarray(used.reshape(1, total, page_size, 1))
  return jnp.where(keep, k_pages, jnp.nan), jnp.where(keep, v_pages, jnp.nan)


@pytest.mark.parametrize("blocks", BLOCKS, indirect=True)
def test_nan_in_unused_pages_never_reaches_the_output(blocks):
  (q, k, v, lengths, table), ref = _decode(*CASES[1])
  k, v = _poison_unused(k, v, lengths, table)
  _assert_close(decode_xla(q, k, v, lengths, table), ref, jnp.float32)

  args, ref = _ragged(*CASES[1])
  n = int(args[6][0])
  k, v = _poison_unused(args[1], args[2], args[3][:n], args[4][:n])
  out = ragged_xla(args[0], k, v, *args[3:])
  _assert_close(out, ref, jnp.float32)


def test_partitioned_over_kv_heads_matches_unsharded():
  """GSPMD (jit with pools and heads sharded over 2 devices) and shard_map per kv-head shard,
  as the engine runs them, give the unsharded result."""
  mesh = Mesh(np.array(jax.devices()[:2]), ("tp",))
  heads, pages = P(None, "tp", None), P("tp", None, None, None)
  q, k, v, lengths, table = decode_case(9, lengths=[4, 33, 200], page_size=8, head_dim=64,
                                        num_kv_heads=2, gqa=4, dtype=jnp.float32)
  put = lambda x, spec: jax.device_put(x, NamedSharding(mesh, spec))   # noqa: E731
  want = np.asarray(decode_xla(q, k, v, lengths, table))
  got = decode_xla(put(q, heads), put(k, pages), put(v, pages), lengths, table)
  np.testing.assert_allclose(np.asarray(got), want, atol=2e-5, rtol=2e-5)
  sm = jax.jit(jax.shard_map(kernels_pallas.paged_attention_xla, mesh=mesh,
                             in_specs=(heads, pages, pages, P(), P()), out_specs=heads,
                             check_vma=False))
  np.testing.assert_allclose(np.asarray(sm(q, k, v, lengths, table)), want, atol=2e-5,
                             rtol=2e-5)

  args = _ragged(*CASES[0])[0]
  want = np.asarray(ragged_xla(*args))
  got = ragged_xla(put(args[0], heads), put(args[1], pages), put(args[2], pages), *args[3:])
  np.testing.assert_allclose(np.asarray(got), want, atol=2e-5, rtol=2e-5)
  sm = jax.jit(jax.shard_map(kernels_pallas.ragged_paged_attention_xla, mesh=mesh,
                             in_specs=(heads, pages, pages) + (P(),) * 4, out_specs=heads,
                             check_vma=False))
  np.testing.assert_allclose(np.asarray(sm(*args)), want, atol=2e-5, rtol=2e-5)
