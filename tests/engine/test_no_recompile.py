"""Steady state never compiles: after warm-up, a workload of varied lengths triggers no trace,
lowering or backend compile, and the compile count equals the bucket arithmetic."""

import jax
import pytest
from jax import monitoring

from conftest import tiny_engine_options
from pdjax.runner import serve_requests as serving
from pdjax.engine.cluster import build_instances
from pdjax.request import Request, SamplingParams, Status


@pytest.mark.slow
def test_no_compiles_after_warm_up(tiny_model):
  cfg, params = tiny_model
  opts = tiny_engine_options()
  instances = build_instances([("colocated", 1, 2), ("prefill", 1, 2), ("decode", 1, 1)], cfg,
                              params, opts)
  # every instance: prefill + decode buckets; prefill adds a gather per transfer bucket,
  # decode a scatter per transfer bucket (max_model_len 96 / page 8 -> 1..12).
  assert opts.transfer_buckets == (1, 2, 4, 8, 12)
  programs = [i.compiles + i.compiles_from_cache for i in instances]   # XLA or the cache
  assert programs == [2 + 2, 2 + 2 + 5, 2 + 2 + 5]

  events = []
  def listener(event, duration, **kwargs):
    if event.startswith("/jax/core/compile") or "compilation_cache" in event:
      events.append(event)
  monitoring.register_event_duration_secs_listener(listener)
  try:
    lengths = [1, 3, 8, 9, 15, 16, 17, 31, 33, 47, 64, 70, 85]
    for mode, insts in (("colocated", instances[:1]), ("disaggregated", instances[1:])):
      reqs = [Request(id=f"{mode}{i}", arrival_s=0.003 * i, prompt_ids=[(i + j) % 400 + 3
                                                                      for j in range(n)],
                      sampling=SamplingParams(max_new_tokens=1 + (7 * i) % 11, ignore_eos=True))
              for i, n in enumerate(lengths)]
      result = serving.serve(mode, insts, reqs)
      assert all(r.status == Status.FINISHED for r in result.requests)
      assert [len(r.output_ids) for r in result.requests] == [1 + (7 * i) % 11
                                                              for i in range(len(lengths))]
      assert serving.kv_pages_leaked(insts) == 0
  finally:
    monitoring.unregister_event_duration_listener(listener)
  assert events == []
  assert [i.compiles + i.compiles_from_cache for i in instances] == [4, 9, 9]
