"""The simulated KV's digest over a long run of tokens (numpy, pdjax/sim/digest.py) equals the
token-by-token chain exactly, and a simulated instance writes the same page digests either way
(prompts starting at any offset in a page, ending on or off a page boundary)."""

import random

import pytest

from pdjax.engine.options import EngineOptions
from pdjax.scheduler.clock import ManualClock
from pdjax.sim import digest, instance
from pdjax.sim.roofline import RooflineCost
from pdjax.sim.hardware import HARDWARE
from pdjax.models.llama_config import PRESETS


def _loop(d, ids):
  out = []
  for t in ids:
    d = digest.mix(d, t)
    out.append(d)
  return out


def test_chain_equals_the_loop():
  rng = random.Random(0)
  for n in (1, 2, 47, 48, 1000, 5000):
    d0 = rng.getrandbits(61)
    ids = [rng.randrange(0, 128256) for _ in range(n)]
    assert digest.chain(d0, ids).tolist() == _loop(d0, ids)
  assert digest.chain(digest.EMPTY, [5, 7]).tolist() == [
      digest.mix(digest.EMPTY, 5), digest.mix(digest.mix(digest.EMPTY, 5), 7)]


def _instance():
  opts = EngineOptions(page_size=16, num_pages=64, max_model_len=1024, prefill_buckets=(1024,),
                       max_prefill_seqs=4, decode_buckets=(4,))
  cost = RooflineCost(PRESETS["tiny"], HARDWARE["h100"], 1)
  return instance.SimInstance("p", "prefill", cost, opts, clock=ManualClock(),
                              vocab_size=512)


@pytest.mark.parametrize("start,n", [(0, 48), (0, 100), (5, 200), (16, 64), (31, 300)])
def test_write_many_equals_token_by_token(monkeypatch, start, n):
  rng = random.Random(start * 1000 + n)
  ids = [rng.randrange(3, 512) for _ in range(start + n)]
  pages = list(range(40))
  results = []
  for vector_min in (10**9, 1):
    monkeypatch.setattr(instance, "VECTOR_MIN", vector_min)
    inst = _instance()
    if start:
      inst._write(ids[:start], 0, pages)   # the cached prefix
    last = inst._write(ids[start:], start, pages)
    results.append((last, dict(inst.digests)))
  assert results[0] == results[1]
  assert len(results[0][1]) == -(-(start + n) // 16)
