"""A simulated decode chain (pdjax/sim/decode_chain.py, BlockTables.extend_steps, the cost
models' decode_s_steps) equals the same steps one at a time, exactly: times to the bit, tokens,
page digests, block tables and the pool's accounting (the decode segments' parts; the whole
is compared run against run in tests/scheduler/test_fast_forward.py)."""

import json
import random

import numpy as np
import pytest

from pdjax.engine.options import EngineOptions
from pdjax.kv.pages import BlockTables, OutOfPages
from pdjax.models.llama_config import PRESETS
from pdjax.scheduler.clock import ManualClock
from pdjax.sim import calibrated
from pdjax.sim.hardware import HARDWARE
from pdjax.sim.instance import SimInstance
from pdjax.sim.roofline import RooflineCost


def _costs():
  yield RooflineCost(PRESETS["tiny"], HARDWARE["h100"], 1)
  yield RooflineCost(PRESETS["llama3_8b"], HARDWARE["tpu_v5e"], 4, eff_flops=0.37)
  yield RooflineCost(PRESETS["llama3_8b"], HARDWARE["h100"], 2, dtype_bytes=1)
  host = {"base_s": 0.0005, "per_seq_s": 0.0001, "waited_share": 0.7}
  profile = {"format": calibrated.FORMAT, "kv_bytes_per_token": 1024.0,
             "instances": {"2": {
                 "prefill": calibrated.StepFit((64.0, 512.0), (0.01, 0.08)).to_json(),
                 "decode": calibrated.StepFit((4.0, 16.0), (0.004, 0.0061), 3.3e-9).to_json(),
                 "transfer": calibrated.StepFit((16384.0,), (0.001,)).to_json()}},
             "host_s": {"prefill": host, "decode": host}}
  opts = EngineOptions(page_size=16, num_pages=64, max_model_len=512, prefill_buckets=(64, 512),
                       max_prefill_seqs=4, decode_buckets=(4, 8, 16))
  yield calibrated.cost_from_profile(json.loads(json.dumps(profile)), 2, opts)


@pytest.mark.parametrize("cost", list(_costs()), ids=lambda c: type(c).__name__)
def test_decode_s_steps_is_decode_s_to_the_bit(cost):
  rng = random.Random(3)
  for batch in (1, 3, 4, 5, 16):
    contexts = [rng.randrange(1, 9000) for _ in range(batch)]
    sums = sum(contexts) + batch * np.arange(50, dtype=np.int64)
    times = cost.decode_s_steps(batch, sums).tolist()
    assert times == [cost.decode_s([c + k for c in contexts]) for k in range(50)]
    floor = cost.decode_s_floor()
    assert 0 < floor <= min(times)


def _instance(eos=(), vocab=512):
  opts = EngineOptions(page_size=4, num_pages=200, max_model_len=1024, prefill_buckets=(1024,),
                       max_prefill_seqs=4, decode_buckets=(32,))
  inst = SimInstance("d", "decode", RooflineCost(PRESETS["tiny"], HARDWARE["h100"], 1), opts,
                     clock=ManualClock(1.5), vocab_size=vocab, eos_ids=eos)
  return inst


def _batch(inst, rows: int, seed: int):
  """rows sequences prefilled to random lengths (some on a page boundary)."""
  rng = random.Random(seed)
  batch = []
  for i in range(rows):
    n = rng.choice([1, 4, 7, 8, rng.randrange(2, 40)])
    inst.tables.allocate(f"s{i}", n)
    prompt = [rng.randrange(3, 500) for _ in range(n)]
    last = inst._token(inst._write(prompt, 0, inst.tables.block_table(f"s{i}")))
    batch.append([f"s{i}", n, last])      # (id, next position, its input token)
  return batch


def _one_by_one(inst, batch, steps):
  """steps rounds of extend + SimInstance.decode, as the scheduler makes them."""
  tokens, ends, pools = [[] for _ in batch], [], []
  for _ in range(steps):
    rows = []
    for seq, pos, tok in batch:
      inst.tables.extend(seq, pos + 1)
      rows.append((tok, pos, inst.tables.block_table(seq), 0.0, 0, 1.0))
    pools.append((inst.tables.num_used_pages, inst.tables.num_unused_slots))
    pending = inst.decode(rows)
    ends.append(pending.end_s)
    inst.clock.advance_to(pending.end_s)
    for row, out, token in zip(batch, tokens, pending.tokens):
      row[1] += 1
      row[2] = token
      out.append(token)
  return tokens, ends, pools


def _state(inst):
  t = inst.tables
  return (dict(inst.digests), {s: list(t._tables[s]) for s in t.seq_ids}, dict(t._held),
          t.num_unused_slots, dict(t.pages_by_owner), dict(t.peak_pages_by_owner),
          sorted(t.allocator._free), list(t.allocator._refcount))


@pytest.mark.parametrize("rows,eos", [(1, ()), (3, (7, 9, 11)), (12, ()), (20, (5, 100))])
def test_a_chain_equals_its_steps_one_by_one(rows, eos):
  steps = 23
  a, b = _instance(eos), _instance(eos)
  batch_a, batch_b = _batch(a, rows, rows), _batch(b, rows, rows)
  want_tokens, want_ends, want_pools = _one_by_one(a, batch_a, steps)

  seqs, positions = [s for s, _, _ in batch_b], [p for _, p, _ in batch_b]
  ends = b.chain_ends(rows, sum(positions) + rows, 1.5, steps, float("inf"))
  tables = [b.tables.pages_of(s) for s in seqs]
  tokens, chain = b.chain_tokens([t for *_, t in batch_b], positions, tables, steps,
                                 [frozenset()] * rows)
  pools = b.tables.extend_steps(seqs, [p + 1 for p in positions], steps)
  b.write_chain(positions, tables, chain)
  assert ends == want_ends and tokens == want_tokens
  assert list(zip(*pools)) == want_pools
  assert _state(b) == _state(a)
  assert all(t not in eos for row in tokens for t in row)


def test_a_chain_stops_after_the_first_stop_token_and_at_the_horizon():
  inst = _instance()
  batch = _batch(inst, 3, 7)
  positions = [p for _, p, _ in batch]
  tables = [inst.tables.pages_of(s) for s, _, _ in batch]
  free, _ = inst.chain_tokens([t for *_, t in batch], positions, tables, 30, [frozenset()] * 3)
  stop_at = 11                          # row 1 samples a stop id at step 11 (its 12th token)
  stops = [frozenset(), frozenset({free[1][stop_at]}), frozenset()]
  first = next(k for k, t in enumerate(free[1]) if t == free[1][stop_at])
  tokens, _ = inst.chain_tokens([t for *_, t in batch], positions, tables, 30, stops)
  assert [len(row) for row in tokens] == [first + 1] * 3
  assert tokens == [row[:first + 1] for row in free]
  ends = inst.chain_ends(3, sum(positions) + 3, 1.5, 30, float("inf"))
  horizon = (ends[4] + ends[5]) / 2     # steps 0-4 end before it, 5 is the first past it
  assert inst.chain_ends(3, sum(positions) + 3, 1.5, 30, horizon) == ends[:6]
  assert inst.chain_ends(3, sum(positions) + 3, 1.5, 30, ends[5]) == ends[:6]
  assert inst.chain_ends(3, sum(positions) + 3, 1.5, 4, horizon) == ends[:4]


def test_extend_steps_refuses_what_the_free_list_cannot_give_and_changes_nothing():
  tables = BlockTables(num_pages=6, page_size=4)
  tables.allocate("a", 4, owner="t")
  tables.allocate("b", 3, owner="t")
  before = (dict(tables._held), tables.num_unused_slots, sorted(tables.allocator._free))
  with pytest.raises(OutOfPages, match="need 7 pages, 4 free"):
    tables.extend_steps(["a", "b"], [5, 4], 13)   # a: 5..17 tokens (+4 pages), b: 4..16 (+3)
  assert (dict(tables._held), tables.num_unused_slots, sorted(tables.allocator._free)) == before
  # round 0: a 5 tokens (a page more), b 4; round 1: b 5 (a page more); round 4: a 9 (one more)
  used, unused = tables.extend_steps(["a", "b"], [5, 4], 5)
  assert used == [3, 4, 4, 4, 5] and unused == [3, 5, 3, 1, 3]
  assert tables.block_table("a") == [0, 2, 4] and tables.block_table("b") == [1, 3]
  assert tables.pages_by_owner["t"] == 5 == tables.peak_pages_by_owner["t"]
