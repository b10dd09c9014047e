"""A KV transfer moves exactly the pages it needs: k pages go as pieces summing to k (the filled
slots of one bucket's programs; no padding to the next bucket), land in their destination pages
and nowhere else."""

import jax
import numpy as np
import pytest

from conftest import tiny_engine_options
from pdjax.engine import mesh as mesh_lib
from pdjax.engine import transfer
from pdjax.engine.instance import Instance

# 40 pages per sequence (not a power of two): transfer buckets 1, 2, 4, 8, 16, 32, 40.
OPTS = dict(page_size=8, num_pages=48, max_model_len=320, prefill_buckets=(32,),
            max_prefill_seqs=2, decode_buckets=(4,))


@pytest.mark.parametrize("buckets,b,slots", [
    ((1, 2, 4, 8, 16, 32, 64), 1, (1,)),
    ((1, 2, 4, 8, 16, 32, 64), 2, (2, 1)),
    ((1, 2, 4, 8, 16, 32, 64), 8, (8, 4, 2, 1)),
    ((1, 2, 4, 8, 16, 32, 64), 32, (32, 16, 8, 4, 2, 1)),
    ((1, 2, 4, 8, 16, 32, 64), 64, (64,)),           # the largest bucket: only itself
    ((1, 2, 4, 8, 16, 32, 40), 32, (32, 4, 2, 1)),   # pages_per_seq 40, not a power of two
    ((1, 2, 4, 8, 12), 8, (8, 2, 1)),
    ((1, 2, 4, 8, 16, 28), 16, (16, 4, 4, 2, 1)),    # the rest 11 = 1 + 2 + 4, then 4
    ((1, 2, 4, 5), 4, (4,)),
])
def test_slots_of_a_bucket(buckets, b, slots):
  assert transfer.slot_sizes(buckets, b) == slots


@pytest.mark.parametrize("buckets,k,pieces", [
    ((1, 2, 4, 8, 12), 1, [1]),
    ((1, 2, 4, 8, 12), 5, [4, 1]),
    ((1, 2, 4, 8, 12), 11, [8, 2, 1]),
    ((1, 2, 4, 8, 12), 12, [12]),           # pages_per_seq, not a power of two: one piece
    ((1, 2, 4, 5), 3, [2, 1]),
    ((1, 2, 4, 5), 5, [5]),
    ((1, 2, 4, 8, 16, 28), 27, [16, 4, 4, 2, 1]),
    ((1, 2, 4, 8, 16, 32, 40), 37, [32, 4, 1]),
    ((1, 2, 4, 8, 16, 32, 40), 39, [32, 4, 2, 1]),
    ((1, 2, 4, 8, 16, 32, 40), 40, [40]),
    ((1, 2, 4, 8, 16, 32, 64), 63, [32, 16, 8, 4, 2, 1]),
    ((1, 2, 4, 8, 16, 32, 64), 64, [64]),
])
def test_transfer_pieces_are_slots_summing_to_k(buckets, k, pieces):
  assert transfer.transfer_pieces(buckets, k) == pieces


@pytest.mark.parametrize("max_model_len", [40, 96, 224, 320, 800, 1024])
def test_every_page_count_splits_exactly(max_model_len):
  """Every k: the largest bucket b <= k, filled slots summing to k, each of the bucket's page
  ids given to at most one page, and the bucket's programs gathering fewer than 2k pages."""
  buckets = tiny_engine_options(max_model_len=max_model_len).transfer_buckets
  for k in range(1, buckets[-1] + 1):
    plan = transfer.transfer_plan(buckets, k)
    assert plan.bucket == max(b for b in buckets if b <= k)
    assert sum(plan.pieces) == k and plan.width == sum(plan.slots) < 2 * k
    assert sorted(plan.positions) == sorted(set(plan.positions)) and len(plan.positions) == k
    ids = plan.ids(list(range(100, 100 + k)), -1)
    assert sorted(ids[ids >= 0]) == list(range(100, 100 + k))
  with pytest.raises(ValueError, match=f"^{buckets[-1] + 1} exceeds the largest bucket"):
    transfer.transfer_pieces(buckets, buckets[-1] + 1)


@pytest.fixture(scope="module")
def pair(tiny_model):
  cfg, params = tiny_model
  opts = tiny_engine_options(**OPTS)
  assert opts.transfer_buckets == (1, 2, 4, 8, 16, 32, 40)
  # Only the transfer programs (the step programs at this length would triple the cost).
  specs = mesh_lib.split_devices(jax.devices(), [("prefill", 1, 4), ("decode", 1, 2)])
  src, dst = (Instance(spec, cfg, params, opts) for spec in specs)
  src.warm_up(prefill=False, decode=False, transfer_to_tp=(dst.tp,))
  dst.warm_up(prefill=False, decode=False, receive=True)
  transfer.warm_up_transfers(src, dst)
  return src, dst


@pytest.mark.parametrize("k", [1, 5, 31, 37, 40])
def test_transfer_moves_exactly_the_pages_needed(pair, k):
  src, dst = pair
  rng = np.random.default_rng(k)
  pool = [rng.standard_normal(src.kv_pool_shape).astype(np.float32) for _ in range(2)]
  src.kv = jax.device_put(tuple(pool), src._kv_sh)
  before = [np.asarray(a) for a in dst.kv]
  src_pages = [int(p) for p in rng.permutation(src.geom.num_pages)[:k]]
  dst_pages = [int(p) for p in rng.permutation(dst.geom.num_pages)[:k]]

  pending = transfer.transfer_kv_async(src, src_pages, dst, dst_pages)
  result = pending.result()
  layers, kvh, _, ps, d = dst.kv_pool_shape
  page_bytes = 2 * layers * kvh * ps * d * 4
  assert result.bytes == k * page_bytes
  assert pending.bytes_needed == pending.bytes_moved == k * page_bytes
  assert pending.ready() and result.seconds > 0

  untouched = [p for p in range(dst.geom.num_pages) if p not in dst_pages]
  for got, want, old in zip((np.asarray(a) for a in dst.kv), pool, before):
    np.testing.assert_array_equal(got[:, :, dst_pages], want[:, :, src_pages])
    np.testing.assert_array_equal(got[:, :, untouched], old[:, :, untouched])
