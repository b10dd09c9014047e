"""Fixtures the Ray test modules import (tests/distributed): HF's greedy outputs for a module's
PROMPTS and MAX_NEW, and a module's RayCluster of local CPU actors (its pull deadline: the
module's PULL_TIMEOUT_S, 2 s unless it sets one)."""

import pytest

from helpers.hf_reference import hf_greedy_outputs


@pytest.fixture(scope="module")
def hf_outputs(hf_llama, request):
  _, model = hf_llama
  return hf_greedy_outputs(model, request.module.PROMPTS, request.module.MAX_NEW)


@pytest.fixture(scope="module")
def ray_cluster(compile_cache, request):
  from pdjax.distributed.launcher import RayCluster
  with RayCluster(accelerator="cpu", pull_timeout_s=getattr(request.module, "PULL_TIMEOUT_S", 2.0),
                  compile_cache_dir=compile_cache) as c:
    yield c
