"""Page reuse never exposes data: with every page of every pool filled with NaN before serving
(what a previous owner may have left), greedy tokens equal the no-cache reference, with the
prefix cache off and on. A page is fully written before it is read, and attention never reads
past a request's length (NaN would spread through any masked read: 0 * NaN = NaN)."""

import jax
import jax.numpy as jnp
import pytest

from conftest import tiny_engine_options
from pdjax import serving
from pdjax.engine import programs
from pdjax.engine.cluster import build_instances
from pdjax.request import Request, SamplingParams, Status

PROMPT_LENS = [1, 7, 9, 17, 40, 40]
MAX_NEW = [6, 12, 9, 16, 8, 10]


def _prompts():
  shared = [(11 * j) % 500 + 3 for j in range(32)]   # the last two share 4 pages of 8
  out = [[(7 * i + 3 * j) % 500 + 3 for j in range(n)] for i, n in enumerate(PROMPT_LENS[:4])]
  return out + [shared + [5] * 8, shared + [6] * 8]


def _poison(inst) -> None:
  nan_pool = jax.jit(lambda kv: jax.tree_util.tree_map(lambda x: jnp.full_like(x, jnp.nan), kv),
                     out_shardings=inst._kv_sh)
  inst.kv = nan_pool(inst.kv)


@pytest.mark.parametrize("prefix_cache", [False, True], ids=["cache-off", "cache-on"])
@pytest.mark.parametrize("mode,tiers", [
    ("colocated", [("colocated", 1, 2)]),
    ("disaggregated", [("prefill", 1, 2), ("decode", 1, 2)]),
], ids=["colo", "disagg"])
def test_poisoned_pools_do_not_leak_into_outputs(tiny_model, mode, tiers, prefix_cache):
  cfg, params = tiny_model
  reference = [programs.reference_generate(params, cfg, p, m, eos_ids=(2,))
               for p, m in zip(_prompts(), MAX_NEW)]
  instances = build_instances(tiers, cfg, params, tiny_engine_options())
  for inst in instances:
    _poison(inst)
    if prefix_cache:
      inst.tables.enable_prefix_cache()
  reqs = [Request(id=f"r{i}", arrival_s=0.02 * i, prompt_ids=p,
                  sampling=SamplingParams(max_new_tokens=m), eos_ids=(2,))
          for i, (p, m) in enumerate(zip(_prompts(), MAX_NEW))]
  result = serving.serve(mode, instances, reqs)
  assert [r.status for r in result.requests] == [Status.FINISHED] * len(reqs)
  assert [r.output_ids for r in result.requests] == reference
  if prefix_cache:
    assert result.requests[-1].cached_tokens in (0, 32)   # 32 when r4 was computed first
