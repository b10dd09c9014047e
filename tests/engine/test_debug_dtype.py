"""The debug check compares a bfloat16 run with the reference computed in bfloat16 (the run's
dtype), where rounding ties are not differences; a leaked token still fails it."""

import pytest

from conftest import tiny_engine_options
from pdjax.runner import serve_requests as serving
from pdjax.engine.cluster import build_instances, host_params
from pdjax.request import Request, SamplingParams, Status

PROMPT_LENS = [1, 7, 9, 17, 40, 75, 33, 60, 12, 5]


@pytest.fixture(scope="module")
def bf16_run(tiny_model):
  cfg, _ = tiny_model
  params = host_params(cfg, checkpoint="", seed=0, dtype="bfloat16")
  instances = build_instances([("colocated", 1, 2)], cfg, params,
                              tiny_engine_options(dtype="bfloat16"))
  reqs = [Request(id=f"r{i}", arrival_s=0.0, prompt_ids=[(7 * i + 3 * j) % 500 + 3
                                                         for j in range(n)],
                  sampling=SamplingParams(max_new_tokens=16), eos_ids=(2,))
          for i, n in enumerate(PROMPT_LENS)]
  result = serving.serve("colocated", instances, reqs)
  assert [r.status for r in result.requests] == [Status.FINISHED] * len(PROMPT_LENS)
  return cfg, params, result.requests


def test_bf16_run_passes_against_the_bf16_reference(bf16_run):
  cfg, params, requests = bf16_run
  assert serving.check_outputs_alone(requests, cfg, params, dtype="bfloat16") == 10


def test_bf16_run_is_not_held_to_float32_numerics(bf16_run):
  # What the check did before: the bf16 run against a float32 reference fails.
  cfg, params, requests = bf16_run
  with pytest.raises(serving.InvariantViolation, match="output differs from the same request"):
    serving.check_outputs_alone(requests, cfg, params, dtype="float32")


def test_a_leaked_token_still_fails_in_bf16(bf16_run):
  cfg, params, requests = bf16_run
  r = requests[4]
  saved = list(r.output_ids)
  try:
    r.output_ids[3] = (r.output_ids[3] + 1) % cfg.vocab_size
    with pytest.raises(serving.InvariantViolation,
                       match="^request r4: output differs from the same request run alone "
                             "from token 3 on$"):
      serving.check_outputs_alone(requests, cfg, params, dtype="bfloat16")
  finally:
    r.output_ids[:] = saved


def test_an_early_eos_fails(bf16_run):
  cfg, params, requests = bf16_run
  r = requests[0]
  forged = Request(id="forged", arrival_s=0.0, prompt_ids=r.prompt_ids,
                   sampling=r.sampling, eos_ids=(r.output_ids[2],), status=Status.FINISHED,
                   output_ids=list(r.output_ids))
  assert len(forged.output_ids) > 3
  with pytest.raises(serving.InvariantViolation, match="from token 2 on$"):
    serving.check_outputs_alone([forged], cfg, params, dtype="bfloat16")
