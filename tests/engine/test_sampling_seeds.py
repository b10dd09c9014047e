"""Sampling at temperature > 0 depends only on (run seed, request seed, token position): the same
request samples the same tokens colocated, with chunked prefill, disaggregated and alone; two
requests with the same prompt sample differently unless they share SamplingParams.seed."""

import dataclasses

import pytest

from conftest import tiny_engine_options
from pdjax.runner import serve_requests as serving
from pdjax.engine import programs
from pdjax.engine.cluster import build_instances
from pdjax.request import Request, SamplingParams, Status
from pdjax.scheduler import policies as policy_lib

PROMPT_LENS = [5, 17, 40, 75]      # 40 and 75 take several 32-token chunks when chunked
MAX_NEW = [6, 8, 5, 7]
ARRIVALS = [0.0, 0.0, 0.01, 0.02]
T = 0.8


def _prompt(i, n):
  return [(11 * i + 5 * j) % 500 + 3 for j in range(n)]


def _requests(arrivals=ARRIVALS, **sampling):
  return [Request(id=f"s{i}", arrival_s=a, prompt_ids=_prompt(i, n),
                  sampling=SamplingParams(temperature=T, max_new_tokens=m, ignore_eos=True,
                                          **sampling), eos_ids=(2,))
          for i, (n, m, a) in enumerate(zip(PROMPT_LENS, MAX_NEW, arrivals))]


def _policies(colocated_policy):
  names = dict(prefill_router="least_loaded", decode_router="least_loaded",
               path="always_disagg", admission="none", colocated_policy=colocated_policy,
               role_switch="none")
  return policy_lib.build(names, dict(token_budget=128, chunk_budget=32, max_prefill_seqs=9))


def _outputs(result):
  assert [r.status for r in result.requests] == [Status.FINISHED] * len(result.requests)
  return [r.output_ids for r in result.requests]


@pytest.fixture(scope="module")
def colocated(tiny_model):
  cfg, params = tiny_model
  return build_instances([("colocated", 1, 1)], cfg, params, tiny_engine_options())


@pytest.fixture(scope="module")
def alone(colocated):
  """Each request served by itself: no batching, no chunking, no transfer."""
  return [_outputs(serving.serve("colocated", colocated, [r]))[0] for r in _requests()]


def test_sampled_outputs_are_real_samples(tiny_model, alone):
  # The oracle itself: full lengths, not the greedy tokens, and different per request.
  cfg, params = tiny_model
  assert [len(o) for o in alone] == MAX_NEW
  greedy = [programs.reference_generate(params, cfg, _prompt(i, n), m)
            for i, (n, m) in enumerate(zip(PROMPT_LENS, MAX_NEW))]
  assert all(a != g for a, g in zip(alone, greedy))
  assert len({t for o in alone for t in o}) > 15


def test_colocated_equals_alone(colocated, alone):
  result = serving.serve("colocated", colocated, _requests(),
                         policies=_policies("prefill_first"))
  assert _outputs(result) == alone


def test_chunked_prefill_equals_alone(tiny_model, alone):
  cfg, params = tiny_model
  instances = build_instances([("colocated", 1, 1)], cfg, params,
                              tiny_engine_options(max_prefill_seqs=9))
  # All at 0 on the wall clock: the first step chunks every prompt it can and the next ones
  # carry decodes with the rest, whatever the machine's speed (with ARRIVALS a slow first step
  # could let the short requests finish before the long ones arrive: no mixed step).
  result = serving.serve("colocated", instances, _requests(arrivals=(0.0,) * 4),
                         policies=_policies("chunked_prefill"))
  assert _outputs(result) == alone
  mixed = [s for s in result.steps if s["kind"] == "mixed"]
  assert mixed, "no step mixed a prompt chunk with decodes: the test lost its point"


def test_disaggregated_equals_alone(tiny_model, alone):
  cfg, params = tiny_model
  instances = build_instances([("prefill", 1, 1), ("decode", 1, 2)], cfg, params,
                              tiny_engine_options())
  result = serving.serve("disaggregated", instances, _requests())
  assert _outputs(result) == alone
  assert len(result.transfers) == len(PROMPT_LENS)


def test_same_prompt_different_id_samples_differently_unless_seeded(colocated):
  prompt, sampling = _prompt(0, 9), SamplingParams(temperature=T, max_new_tokens=8,
                                                   ignore_eos=True)
  seeded = dataclasses.replace(sampling, seed=1234)
  reqs = [Request(id="a", arrival_s=0.0, prompt_ids=prompt, sampling=sampling),
          Request(id="b", arrival_s=0.0, prompt_ids=prompt, sampling=sampling),
          Request(id="c", arrival_s=0.0, prompt_ids=prompt, sampling=seeded),
          Request(id="d", arrival_s=0.0, prompt_ids=prompt, sampling=seeded)]
  a, b, c, d = _outputs(serving.serve("colocated", colocated, reqs))
  assert a != b and a != c
  assert c == d
  # The seed, not the id, fixes the tokens: request c again, alone, under another id.
  again = Request(id="another-id", arrival_s=0.0, prompt_ids=prompt, sampling=seeded)
  assert _outputs(serving.serve("colocated", colocated, [again])) == [c]
