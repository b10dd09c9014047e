"""model.attention_impl: the Pallas kernels (interpret mode on CPU, per TP shard) give the same
greedy tokens as the XLA path in a disaggregated run with different TP on each tier."""

import pytest

from conftest import tiny_engine_options
from pdjax.runner import serve_requests as serving
from pdjax.engine.attention import resolve_impl
from pdjax.engine.cluster import build_instances
from pdjax.request import Request, SamplingParams, Status

PROMPTS = [[5, 6, 7, 8, 9], [3] * 17, list(range(40, 80))]


def _serve(tiny_model, impl):
  cfg, params = tiny_model
  opts = tiny_engine_options(attention_impl=impl, prefill_buckets=(64,), decode_buckets=(4,))
  instances = build_instances([("prefill", 1, 4), ("decode", 1, 2)], cfg, params, opts)
  reqs = [Request(id=f"r{i}", arrival_s=0.0, prompt_ids=p,
                  sampling=SamplingParams(max_new_tokens=6), eos_ids=(2,))
          for i, p in enumerate(PROMPTS)]
  result = serving.serve("disaggregated", instances, reqs)
  assert [r.status for r in result.requests] == [Status.FINISHED] * 3
  assert serving.kv_pages_leaked(instances) == 0
  return [r.output_ids for r in result.requests]


@pytest.mark.slow
def test_pallas_interpret_tokens_equal_xla(tiny_model):
  xla = _serve(tiny_model, "xla")
  assert [len(o) for o in xla] == [6, 6, 6]
  assert _serve(tiny_model, "pallas") == xla


def test_resolve_impl_on_cpu():
  assert (resolve_impl("auto").impl, resolve_impl("auto").interpret) == ("xla", False)
  assert (resolve_impl("pallas").impl, resolve_impl("pallas").interpret) == ("pallas", True)
  with pytest.raises(ValueError) as e:
    resolve_impl("cuda")
  assert str(e.value) == "model.attention_impl='cuda' is not one of ['auto', 'pallas', 'xla']"
