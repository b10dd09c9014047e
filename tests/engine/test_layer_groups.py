"""Layer-group KV streaming on the engine (engine/layer_groups.py): a prefill run as G layer
group programs samples the same tokens and writes the same KV as the one-program prefill, and
the pages streamed group by group land on the decode instance exactly as one whole transfer
puts them there, across TP degrees."""

import jax
import numpy as np
import pytest

from conftest import tiny_engine_options
from pdjax.engine import transfer
from pdjax.engine.cluster import build_instances
from pdjax.engine.layer_groups import group_bounds

PROMPTS = ([3, 17, 5, 9, 11, 2, 40, 41, 7, 8, 1, 6, 19], [23, 5, 5, 61, 2])


def test_group_bounds_cover_the_layers_larger_groups_first():
  assert group_bounds(30, 4) == ((0, 8), (8, 16), (16, 23), (23, 30))
  assert group_bounds(2, 2) == ((0, 1), (1, 2))
  assert group_bounds(5, 1) == ((0, 5),)
  with pytest.raises(ValueError, match=r"layer groups must be in \[1, 2\] \(the model's "
                                       r"layers\), got 3"):
    group_bounds(2, 3)


def _prefill_and_send(cfg, params, src_tp, dst_tp, groups):
  """Prefills PROMPTS on a fresh prefill instance and moves their KV to a fresh decode
  instance: streamed with `groups` layer groups, or after the step (groups 0). Returns (tokens,
  the source pool, the destination pool, the transfers' bytes)."""
  opts = tiny_engine_options(stream_layers=groups)
  src, dst = build_instances([("prefill", 1, src_tp), ("decode", 1, dst_tp)], cfg, params,
                             opts)
  seqs, sends = [], []
  for i, prompt in enumerate(PROMPTS):
    pages = src.tables.allocate(f"r{i}", len(prompt))
    dst_pages = dst.tables.allocate(f"r{i}", len(prompt) + 1)[:len(pages)]
    seqs.append((prompt, 0, pages, 0.0, i, 1.0))
    sends.append((dst, pages, dst_pages))
  if groups:
    pending = src.prefill(seqs, streams=sends)
    tokens = pending.result()
    results = [t.result() for t in pending.streams]
  else:
    tokens = src.prefill(seqs).result()
    results = [transfer.transfer_kv(src, s, d_inst, d) for d_inst, s, d in
               [(d_inst, s, d) for d_inst, s, d in sends]]
  jax.block_until_ready(dst.kv)
  pools = [np.asarray(a) for a in src.kv], [np.asarray(a) for a in dst.kv]
  return tokens, pools[0], pools[1], [r.bytes for r in results]


@pytest.mark.parametrize("src_tp,dst_tp", [(1, 1), (2, 1), (1, 2)])
def test_streamed_prefill_equals_the_one_program_prefill_and_transfer(tiny_model, src_tp,
                                                                       dst_tp):
  cfg, params = tiny_model
  base = _prefill_and_send(cfg, params, src_tp, dst_tp, 0)
  for groups in (1, cfg.num_layers):
    got = _prefill_and_send(cfg, params, src_tp, dst_tp, groups)
    assert got[0] == base[0]                         # the sampled first tokens
    for a, b in zip(got[1] + got[2], base[1] + base[2]):   # both pools, k and v, bit for bit
      np.testing.assert_array_equal(a, b)
    assert got[3] == base[3]                         # the same bytes moved in all


def test_streams_need_stream_layers(tiny_model):
  cfg, params = tiny_model
  src, dst = build_instances([("prefill", 1, 1), ("decode", 1, 1)], cfg, params,
                             tiny_engine_options())
  pages = src.tables.allocate("r", 5)
  with pytest.raises(ValueError, match="prefill-0: streams given but kv.stream_layers is 0"):
    src.prefill([(PROMPTS[1], 0, pages, 0.0, 0, 1.0)], streams=[(dst, pages, pages)])


def test_a_middle_group_and_uneven_groups_on_three_layers(tiny_model):
  """Three layers: G=2 (groups of 2 and 1 layers) and G=3 (a middle group taking and
  returning the hidden state) equal the one-program prefill, TP2 -> TP1."""
  import dataclasses
  from pdjax.models.llama import init_params
  cfg = dataclasses.replace(tiny_model[0], num_layers=3)
  params = jax.tree_util.tree_map(np.asarray, init_params(cfg, seed=1))
  base = _prefill_and_send(cfg, params, 2, 1, 0)
  for groups in (2, 3):
    got = _prefill_and_send(cfg, params, 2, 1, groups)
    assert got[0] == base[0]
    for a, b in zip(got[1] + got[2], base[1] + base[2]):
      np.testing.assert_array_equal(a, b)
