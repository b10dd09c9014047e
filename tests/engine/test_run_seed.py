"""The run seed is a step's data, not a constant of its program: one compiled instance samples
exactly what an instance built for that seed samples, after `reset`, without compiling again."""

import dataclasses

import pytest

from conftest import tiny_engine_options
from pdjax.engine.cluster import build_instances
from pdjax.request import Request, SamplingParams, Status
from pdjax.runner import serve_requests as serving


def _requests():
  return [Request(id=f"r{i}", arrival_s=0.0, prompt_ids=[(7 * i + 3 * j) % 400 + 3
                                                         for j in range(9 + 5 * i)],
                  sampling=SamplingParams(temperature=0.9, max_new_tokens=6, ignore_eos=True),
                  eos_ids=(2,))
          for i in range(3)]


def _outputs(instances):
  result = serving.serve("colocated", instances, _requests())
  assert [r.status for r in result.requests] == [Status.FINISHED] * 3
  return [r.output_ids for r in result.requests]


@pytest.fixture(scope="module")
def seeded(tiny_model):
  """{seed: outputs} of instances built for seeds 0 and 7."""
  cfg, params = tiny_model
  return {seed: _outputs(build_instances([("colocated", 1, 1)], cfg, params,
                                         tiny_engine_options(seed=seed)))
          for seed in (0, 7)}


def test_a_reset_instance_samples_as_one_built_for_its_seed(tiny_model, seeded):
  cfg, params = tiny_model
  assert seeded[0] != seeded[7]                    # the seed reaches the samples
  [inst] = build_instances([("colocated", 1, 1)], cfg, params, tiny_engine_options(seed=0))
  built = inst.compiles + inst.compiles_from_cache
  assert built == 4                                # 2 prefill + 2 decode buckets
  assert _outputs([inst]) == seeded[0]
  inst.reset(run_seed=7)
  assert (inst.compiles, inst.compiles_from_cache, inst.run_seed) == (0, 0, 7)
  assert _outputs([inst]) == seeded[7]
  inst.reset(run_seed=0)
  assert _outputs([inst]) == seeded[0]
  # nothing compiled after the build: the programs took each seed as data
  assert (inst.compiles, inst.compiles_from_cache) == (0, 0)


def test_reset_refuses_an_instance_holding_pages(tiny_model):
  cfg, params = tiny_model
  [inst] = build_instances([("colocated", 1, 1)], cfg, params, tiny_engine_options())
  inst.tables.allocate("held", 3)
  with pytest.raises(RuntimeError, match=r"^colocated-0: reset with 1 pages in use$"):
    inst.reset(run_seed=1)


def test_reset_drops_what_the_last_run_attached(tiny_model):
  cfg, params = tiny_model
  [inst] = build_instances([("colocated", 1, 1)], cfg, params, tiny_engine_options())
  inst.node, inst.node_link, inst.cost = 1, object(), object()
  inst.tables.enable_prefix_cache(8, 0.0, "lru")
  inst.reset(run_seed=3)
  assert inst.tables.cache is None
  assert not any(hasattr(inst, name) for name in ("node", "node_link", "cost"))
  assert dataclasses.asdict(inst.opts)["seed"] == 0   # the options stay the build's
