"""Layer-group KV streaming on the engine (engine/layer_groups.py): a prefill run as G layer
group programs samples the same tokens and writes the same KV as the one-program prefill, and
the pages streamed group by group land on the decode instance exactly as one whole transfer
puts them there, across TP degrees."""

import dataclasses

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
  opts = tiny_engine_options(stream_layers=groups, lazy_compile=True)   # (only the step
  src, dst = build_instances([("prefill", 1, src_tp), ("decode", 1, dst_tp)], cfg, params,
                             opts)                                     #  programs used)
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


@pytest.mark.parametrize("src_tp,dst_tp", [(1, 1), pytest.param(2, 1, marks=pytest.mark.slow),
                                           pytest.param(1, 2, marks=pytest.mark.slow)])
def test_streamed_prefill_equals_the_one_program_prefill_and_transfer(tiny_model, src_tp,
                                                                       dst_tp):
  cfg, params = tiny_model
  base = _prefill_and_send(cfg, params, src_tp, dst_tp, 0)
  # (one group, the step's programs split nowhere, once: the TP changes are the layered
  # gathers' and scatters' business, which num_layers groups exercise)
  for groups in ((1, cfg.num_layers) if src_tp == dst_tp == 1 else (cfg.num_layers,)):
    got = _prefill_and_send(cfg, params, src_tp, dst_tp, groups)
    assert got[0] == base[0]                         # the sampled first tokens
    for a, b in zip(got[1] + got[2], base[1] + base[2]):   # both pools, k and v, bit for bit
      np.testing.assert_array_equal(a, b)
    assert got[3] == base[3]                         # the same bytes moved in all


@pytest.mark.slow
def test_calibration_measures_the_streamed_steps_extra_time_per_group(tiny_model):
  """pdjax.calibrate's stream_group_s (engine/stream_timing.py): the largest prefill bucket
  that fits, one program vs. the model's layers as groups streaming to a decode instance, on
  the given instances' devices; its own instances' pages all freed."""
  from pdjax.engine.stream_timing import measure_stream_group_s
  cfg, params = tiny_model
  opts = tiny_engine_options()
  src, dst = build_instances([("prefill", 1, 1), ("decode", 1, 1)], cfg, params, opts)
  out = measure_stream_group_s(src, dst, cfg, params, opts, 0, repeats=2)
  assert (out["groups"], out["tokens"]) == (2, 32)   # max_model_len 96: the 128 bucket can't
  assert out["one_program_s"] > 0 and out["streamed_s"] > 0
  assert out["seconds"] == max(0.0, out["streamed_s"] - out["one_program_s"])
  assert src.tables.num_used_pages == dst.tables.num_used_pages == 0
  one_layer = dataclasses.replace(cfg, num_layers=1)
  assert measure_stream_group_s(src, dst, one_layer, params, opts, 0, 2)["seconds"] == 0.0


def test_streams_need_stream_layers(tiny_model):
  cfg, params = tiny_model
  src, dst = build_instances([("prefill", 1, 1), ("decode", 1, 1)], cfg, params,
                             tiny_engine_options())
  pages = src.tables.allocate("r", 5)
  with pytest.raises(ValueError, match="prefill-0: streams given but kv.stream_layers is 0"):
    src.prefill([(PROMPTS[1], 0, pages, 0.0, 0, 1.0)], streams=[(dst, pages, pages)])


@pytest.mark.slow
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


@pytest.mark.slow
def test_streamed_runs_match_unstreamed_with_prefix_hits_and_chunked_prompts(tmp_path):
  """The real engine through the CLI (smoke config, disaggregated TP2 -> TP1): multi-turn
  sessions with the prefix cache on (decode-side hits: only the uncached pages travel) and
  prefill buckets of at most 128 tokens (longer prompts prefill in chunks): the same greedy
  tokens with kv.stream_layers=2 as with 0, every moved request streamed (sent before its
  prefill ended), nothing leaked."""
  import json
  import subprocess
  import sys
  runs = {}
  for groups in (0, 2):
    out = tmp_path / str(groups)
    proc = subprocess.run(
        [sys.executable, "-m", "pdjax.run", "--config=configs/default.py:smoke",
         "--config.progress=False", "--config.mode=disaggregated",
         "--config.cluster.prefill.tp=2", "--config.cluster.decode.tp=1",
         "--config.workload.preset=agent_multiturn", "--config.workload.num_requests=8",
         "--config.scheduler.decode_router=session_sticky", "--config.kv.prefix_cache=True",
         "--config.scheduler.prefill_buckets=(64,128)", f"--config.kv.stream_layers={groups}",
         "--config.kv.stream_min_tokens=0", f"--workdir={out}"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs[groups] = ([json.loads(l) for l in (out / "requests.jsonl").open()],
                    json.loads((out / "summary.json").read_text()))
  (base, base_sum), (got, got_sum) = runs[0], runs[2]
  assert [r["output_ids"] for r in got] == [r["output_ids"] for r in base]
  assert all(r["status"] == "finished" for r in got) and got_sum["kv_pages_leaked"] == 0
  moved = [r for r in got if r["transfer_end_s"] is not None]
  assert moved and all(r["transfer_start_s"] < r["prefill_end_s"] for r in moved)
  for r in moved:   # two groups' landings, in order, the last the transfer's own end
    first, last = r["transfer_group_ends_s"]
    assert 0 < first <= last == r["transfer_s"]
  assert max(r["prompt_len"] for r in got) > 128               # chunked
  assert got_sum["kv_cache"]["decode_hit_tokens"] > 0           # decode-side prefix hits
