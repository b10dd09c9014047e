"""Page reuse never exposes data: with every page of every pool filled with NaN before serving
(what a previous owner may have left), greedy tokens equal the no-cache reference, with the
prefix cache off and on. A page is fully written before it is read, and attention never reads
past a request's length (NaN would spread through any masked read: 0 * NaN = NaN).

With the cache on, r5 repeats r4's first 32 tokens (4 full pages) and is admitted only once r4's
KV is computed (disaggregated: landed on the decode instance too), so it must hit those 4
pages. Left to the wall clock it would not always: the loop admits arrivals only between
turns, and a turn waits for a step to end, so when no step ends between r4's and r5's arrivals
(20 ms apart; a slow step on a busy host) both are admitted and planned in the same turn, and
the plan allocates r5's pages (a prefix match) before r4's pages hold any KV: r5 misses."""

import jax
import jax.numpy as jnp
import pytest

from conftest import tiny_engine_options
from pdjax.runner import serve_requests as serving
from pdjax.engine import programs
from pdjax.engine.cluster import build_instances
from pdjax.request import Request, SamplingParams, Status
from pdjax.scheduler.driver import Driver

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
def test_poisoned_pools_do_not_leak_into_outputs(tiny_model, mode, tiers, prefix_cache,
                                                monkeypatch):
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
  if prefix_cache:
    r4 = reqs[4]
    computed = ((lambda: r4.prefill_end_s is not None) if mode == "colocated" else
                (lambda: r4.transfer_end_s is not None))
    admit = Driver._admit

    def admit_r5_after_r4(self, arrivals):
      if computed() or not arrivals or arrivals[-1].id != "r5":
        return admit(self, arrivals)
      r5 = arrivals.pop()              # arrived or not, r5 waits until r4's KV is computed
      admit(self, arrivals)
      arrivals.append(r5)

    monkeypatch.setattr(Driver, "_admit", admit_r5_after_r4)
  result = serving.serve(mode, instances, reqs)
  assert [r.status for r in result.requests] == [Status.FINISHED] * len(reqs)
  assert [r.output_ids for r in result.requests] == reference
  if prefix_cache:
    r5 = result.requests[-1]
    # (40 - 1) // 8 = 4 pages may hit (one token is always computed): the 32 shared tokens.
    assert (r5.cached_tokens, r5.decode_cached_tokens) == (
        (32, 0) if mode == "colocated" else (32, 32))
  else:
    assert [(r.cached_tokens, r.decode_cached_tokens) for r in result.requests] == [(0, 0)] * 6
