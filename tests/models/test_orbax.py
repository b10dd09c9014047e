"""pdjax.convert and orbax checkpoints: restored onto TP1/2/4 instances, every parameter equals
the HF-loaded one bit for bit and sits on the instance's sharding; both formats serve the same
greedy tokens; config and tokenizer files travel along; bad folders fail with one line."""

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from conftest import tiny_engine_options
from helpers.paths import ROOT
from pdjax import config as config_lib
from pdjax.runner import serve_requests as serving
from pdjax.engine.hf_to_orbax import convert
from pdjax.engine import mesh as mesh_lib
from pdjax.engine.cluster import as_host, build_instances, host_params
from pdjax.engine.instance import Instance
from pdjax.models import orbax_checkpoint
from pdjax.models.llama_config import config_from_hf
from pdjax.models.param_layout import to_layout
from pdjax.request import Request, SamplingParams, Status

TOKENIZER_FILES = {"tokenizer.json": b'{"version": "1.0"}', "tokenizer_config.json": b"{}",
                   "special_tokens_map.json": b'{"bos_token": "<s>"}',
                   "chat_template.jinja": b"{{ messages }}", "tokenizer.model": bytes(range(256))}
NEITHER = ("model.checkpoint: {} is neither a pdjax orbax checkpoint (pdjax_checkpoint.json) "
           "nor a Hugging Face one (config.json + *.safetensors)")


def _hf_llama(path, torch_dtype: str) -> str:
  """A tiny random HF Llama with 4 kv heads (TP 1, 2 and 4 all shard it), tokenizer files
  beside it; saved in torch_dtype like a published checkpoint."""
  import torch
  import transformers
  cfg = transformers.LlamaConfig(
      vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
      num_attention_heads=8, num_key_value_heads=4, rms_norm_eps=1e-6,
      max_position_embeddings=256, bos_token_id=1, eos_token_id=2, initializer_range=0.1)
  torch.manual_seed(0)
  model = transformers.LlamaForCausalLM(cfg).eval().to(getattr(torch, torch_dtype))
  model.save_pretrained(str(path))
  for name, data in TOKENIZER_FILES.items():
    (path / name).write_bytes(data)
  return str(path)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  """{stored dtype: (hf folder, orbax folder)}, converted by the function."""
  out = {}
  for dtype in ("float32", "bfloat16"):
    hf = _hf_llama(tmp_path_factory.mktemp(f"hf_{dtype}"), dtype)
    orbax = str(tmp_path_factory.mktemp(f"orbax_{dtype}"))
    assert convert(hf, orbax)["dtype"] == dtype
    out[dtype] = (hf, orbax)
  return out


def _instance(cfg, params, tp: int, dtype: str) -> Instance:
  spec = mesh_lib.InstanceSpec(f"colocated-tp{tp}", "colocated", tuple(jax.devices()[8 - tp:]))
  return Instance(spec, cfg, params, tiny_engine_options(dtype=dtype))


def _bits(x) -> tuple:
  a = np.asarray(x)
  return a.dtype, a.shape, a.tobytes()


@pytest.mark.parametrize("stored,dtype,tp", [
    ("float32", "float32", 1), ("float32", "float32", 2), ("float32", "float32", 4),
    ("float32", "bfloat16", 2), ("bfloat16", "float32", 2), ("bfloat16", "bfloat16", 4)])
def test_restore_equals_hf_load_bit_for_bit(checkpoints, stored, dtype, tp):
  hf, orbax = checkpoints[stored]
  cfg = config_from_hf(hf)
  restored = host_params(cfg, checkpoint=orbax, seed=0, dtype=dtype)
  assert isinstance(restored, orbax_checkpoint.OrbaxParams)
  a = _instance(cfg, host_params(cfg, checkpoint=hf, seed=0, dtype=dtype), tp, dtype)
  b = _instance(cfg, restored, tp, dtype)
  assert jax.tree_util.tree_structure(a.params) == jax.tree_util.tree_structure(b.params)
  for (path, x), y, sh in zip(jax.tree_util.tree_leaves_with_path(a.params),
                              jax.tree_util.tree_leaves(b.params),
                              jax.tree_util.tree_leaves(b._param_sh)):
    name = jax.tree_util.keystr(path)
    assert y.sharding == sh == x.sharding, name
    assert [s.data.shape for s in y.addressable_shards] == [s.data.shape
                                                             for s in x.addressable_shards]
    assert _bits(y) == _bits(x), name
  host = to_layout(as_host(restored), cfg.num_layers, a.param_layout)
  assert jax.tree_util.tree_map(_bits, host) == jax.tree_util.tree_map(_bits, a.params)


def test_both_formats_serve_the_same_greedy_tokens(checkpoints):
  hf, orbax = checkpoints["float32"]
  cfg = config_from_hf(hf)
  prompts = [[1, 5, 9, 14, 27], [1, 100, 3], [1] + list(range(10, 40))]
  outputs = []
  for path in (hf, orbax):
    params = host_params(cfg, checkpoint=path, seed=0, dtype="float32")
    instances = build_instances([("colocated", 1, 2)], cfg, params, tiny_engine_options())
    reqs = [Request(id=f"r{i}", arrival_s=0.0, prompt_ids=p,
                    sampling=SamplingParams(max_new_tokens=8, ignore_eos=True))
            for i, p in enumerate(prompts)]
    result = serving.serve("colocated", instances, reqs)
    assert [r.status for r in result.requests] == [Status.FINISHED] * 3
    outputs.append([r.output_ids for r in result.requests])
  assert outputs[0] == outputs[1]
  assert [len(o) for o in outputs[1]] == [8, 8, 8]


def test_cli_writes_the_same_checkpoint_and_copies_files(checkpoints, tmp_path):
  hf, orbax = checkpoints["bfloat16"]
  out = tmp_path / "cli"
  proc = subprocess.run([sys.executable, "-m", "pdjax.convert", f"--checkpoint={hf}",
                         f"--out={out}"], capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.startswith(f"wrote {out}: 12 tensors, bfloat16,"), proc.stdout
  names = sorted(["config.json", "generation_config.json", *TOKENIZER_FILES])
  marker = json.loads((out / orbax_checkpoint.MARKER).read_text())
  assert marker["copied"] == names and marker["storage_tp"] == 4
  assert sorted(os.listdir(out)) == sorted(names + ["params", orbax_checkpoint.MARKER])
  for name in names:
    with open(os.path.join(hf, name), "rb") as f:
      assert (out / name).read_bytes() == f.read(), name
  assert orbax_checkpoint.checkpoint_format(str(out)) == "orbax"
  assert orbax_checkpoint.checkpoint_format(hf) == "hf"
  cli = orbax_checkpoint.OrbaxParams(str(out), "bfloat16").host()
  assert (jax.tree_util.tree_map(_bits, cli) ==
          jax.tree_util.tree_map(_bits, orbax_checkpoint.OrbaxParams(orbax, "bfloat16").host()))


def _validate(checkpoint: str) -> str:
  cfg = config_lib.load_config_module(os.path.join(ROOT, "configs", "default.py")).get_config()
  cfg.model.checkpoint = checkpoint
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg)
  return str(e.value)


def test_bad_folders_fail_with_one_line(checkpoints, tmp_path):
  hf, orbax = checkpoints["float32"]
  neither = tmp_path / "neither"
  neither.mkdir()
  shutil.copy(os.path.join(hf, "config.json"), neither)       # config.json, no safetensors
  assert _validate(str(neither)) == NEITHER.format(neither)
  no_params = tmp_path / "no_params"
  shutil.copytree(orbax, no_params, ignore=shutil.ignore_patterns("params"))
  assert _validate(str(no_params)) == (
      f"model.checkpoint: {no_params} has pdjax_checkpoint.json but no params/ folder "
      f"(convert again with python -m pdjax.convert)")
  bad_marker = tmp_path / "bad_marker"
  shutil.copytree(orbax, bad_marker)
  marker = json.loads((bad_marker / orbax_checkpoint.MARKER).read_text())
  (bad_marker / orbax_checkpoint.MARKER).write_text(json.dumps({**marker, "version": 2}))
  assert _validate(str(bad_marker)) == (
      f"model.checkpoint: {bad_marker}/pdjax_checkpoint.json is not a pdjax-orbax marker of "
      f"version 1")
  with pytest.raises(ValueError) as e:
    convert(hf, orbax)
  assert str(e.value) == f"convert: --out={orbax} exists and is not an empty folder"
  # The entry points: pdjax.run and pdjax.convert print the line and exit 2.
  for args, line in (
      (["pdjax.run", f"--config.model.checkpoint={no_params}"],
       f"config error: {_validate(str(no_params))}"),
      (["pdjax.convert", f"--checkpoint={neither}", f"--out={tmp_path / 'out'}"],
       "convert: " + NEITHER.format(neither).removeprefix("model.checkpoint: "))):
    proc = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          timeout=120)
    assert (proc.returncode, proc.stderr.strip()) == (2, line)
