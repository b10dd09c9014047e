"""KV transfer between sub-meshes: exact pages arrive, across TP degrees, never via the host."""

import jax
import numpy as np
import pytest
from jax._src import array as jax_array

from conftest import tiny_engine_options
from pdjax.engine import transfer
from pdjax.engine.cluster import build_instances


def _fill_pool(inst, seed):
  """Distinct random values in every page, so a wrong page or head shows up."""
  rng = np.random.default_rng(seed)
  k = rng.standard_normal(inst.kv_pool_shape).astype(np.float32)
  v = rng.standard_normal(inst.kv_pool_shape).astype(np.float32)
  inst.kv = jax.device_put((k, v), inst._kv_sh)
  return k, v


SLOW = pytest.mark.slow   # each case builds two instances: the fast tier keeps the first
@pytest.mark.parametrize("src_tp,dst_tp", [(2, 2), pytest.param(4, 2, marks=SLOW),
                                           pytest.param(1, 2, marks=SLOW),
                                           pytest.param(2, 4, marks=SLOW),
                                           pytest.param(1, 1, marks=SLOW)])
def test_transfer_moves_exact_pages_without_host_copy(tiny_model, monkeypatch, src_tp, dst_tp):
  cfg, params = tiny_model
  src, dst = build_instances([("prefill", 1, src_tp), ("decode", 1, dst_tp)], cfg, params,
                             tiny_engine_options())
  k, v = _fill_pool(src, seed=src_tp * 10 + dst_tp)
  dst_before = [np.asarray(a) for a in dst.kv]
  src_pages, dst_pages = [5, 0, 17, 9, 30], [2, 40, 3, 11, 7]

  def no_host(self):
    raise AssertionError("KV transfer materialised an array on the host")
  monkeypatch.setattr(jax_array.ArrayImpl, "_value", property(no_host))
  result = transfer.transfer_kv(src, src_pages, dst, dst_pages)
  jax.block_until_ready(dst.kv)
  monkeypatch.undo()

  assert dst.kv[0].sharding == dst.kv_sharding
  got_k, got_v = (np.asarray(a) for a in dst.kv)
  np.testing.assert_array_equal(got_k[:, :, dst_pages], k[:, :, src_pages])
  np.testing.assert_array_equal(got_v[:, :, dst_pages], v[:, :, src_pages])
  untouched = [p for p in range(dst.geom.num_pages) if p not in dst_pages]
  np.testing.assert_array_equal(got_k[:, :, untouched], dst_before[0][:, :, untouched])
  # exactly the 5 pages travel (4 + 1, no padding): 2 (k, v) x layers x kv_heads x 5 x
  # page_size x head_dim.
  layers, kvh, _, ps, d = src.kv_pool_shape
  assert result.bytes == 2 * layers * kvh * 5 * ps * d * 4
  assert result.seconds > 0


def test_transfer_rejects_mismatched_page_counts(tiny_model):
  cfg, params = tiny_model
  src, dst = build_instances([("prefill", 1, 1), ("decode", 1, 1)], cfg, params,
                             tiny_engine_options())
  with pytest.raises(ValueError, match="page counts differ: 2 source, 1 destination"):
    transfer.transfer_kv(src, [1, 2], dst, [3])


class _Counted:
  """A compiled program that counts its calls."""

  def __init__(self, fn, calls: list, name: str):
    self.fn, self.calls, self.name = fn, calls, name

  def __call__(self, *args):
    self.calls.append(self.name)
    return self.fn(*args)


@pytest.mark.parametrize("src_tp,dst_tp,k", [(2, 2, 37), pytest.param(4, 2, 7, marks=SLOW),
                                             pytest.param(1, 2, 12, marks=SLOW),
                                             pytest.param(2, 2, 1, marks=SLOW)])
def test_a_transfer_is_one_gather_one_copy_one_scatter(tiny_model, monkeypatch, src_tp, dst_tp,
                                                         k):
  """Whatever the number of bucket pieces (37 = 32 + 4 + 1), a transfer dispatches one gather
  program on the source, one device_put and one scatter program on the destination, and the
  pages land exact."""
  cfg, params = tiny_model
  opts = tiny_engine_options(max_model_len=512, num_pages=80)
  src, dst = build_instances([("prefill", 1, src_tp), ("decode", 1, dst_tp)], cfg, params, opts)
  k_pool, v_pool = _fill_pool(src, seed=k)
  calls = []
  for key, entry in list(src._gather.items()):
    monkeypatch.setitem(src._gather, key, (_Counted(entry[0], calls, "gather"),) + entry[1:])
  for key, entry in list(dst._scatter.items()):
    if isinstance(entry, tuple):         # (program, blanks)
      monkeypatch.setitem(dst._scatter, key, (_Counted(entry[0], calls, "scatter"), entry[1]))
    else:                                # one program per piece (before issue 28)
      monkeypatch.setitem(dst._scatter, key, _Counted(entry, calls, "scatter"))
  put = jax.device_put
  monkeypatch.setattr(jax, "device_put", lambda *a, **kw: calls.append("put") or put(*a, **kw))
  rng = np.random.default_rng(k)
  src_pages = [int(p) for p in rng.permutation(src.geom.num_pages)[:k]]
  dst_pages = [int(p) for p in rng.permutation(dst.geom.num_pages)[:k]]

  result = transfer.transfer_kv(src, src_pages, dst, dst_pages)
  monkeypatch.undo()

  assert calls == ["gather", "put", "scatter"]
  got_k, got_v = (np.asarray(a) for a in dst.kv)
  np.testing.assert_array_equal(got_k[:, :, dst_pages], k_pool[:, :, src_pages])
  np.testing.assert_array_equal(got_v[:, :, dst_pages], v_pool[:, :, src_pages])
  assert result.bytes == k * transfer.page_bytes(dst)
