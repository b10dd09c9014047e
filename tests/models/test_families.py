"""Model families against transformers, from tiny random float32 checkpoints made here: Llama 3.1
(llama3 RoPE scaling), Qwen2 (q/k/v bias, tied embeddings), Mistral (explicit head_dim, no
sliding window), Llama with attention_bias (q/k/v/o bias). Dense logits within 2e-5 of torch;
greedy tokens equal HF generate colocated (TP1) and disaggregated with a TP change (TP2 -> TP1).
What the model does not implement is refused with one line naming it."""

import dataclasses
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from pdjax.runner import serve_requests as serving
from pdjax.engine.cluster import build_instances, host_params
from pdjax.engine.options import EngineOptions
from pdjax.models.hf_loader import load_hf_checkpoint
from pdjax.models.llama import Llama, rope_inv_freq
from pdjax.models.llama_config import config_from_hf
from pdjax.request import Request, SamplingParams, Status

PROMPTS = [[1, 5, 9, 14, 27, 3, 88], [1, 100], [1] + list(range(10, 60))]
MAX_NEW = 8
# Llama 3.1's rope with a short original context: at head_dim 16 and theta 5e5 the frequencies
# fall in all three llama3 bands (kept, smoothed, divided by factor).
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
# name: (transformers class, config kwargs); the older rope spelling works in 4.x and 5.x.
FAMILIES = {
    "llama3": ("Llama", dict(rope_scaling=dict(LLAMA3_ROPE), rope_theta=500000.0)),
    "qwen2": ("Qwen2", dict(rope_theta=1000000.0, tie_word_embeddings=True,
                            use_sliding_window=False, sliding_window=32)),
    "mistral": ("Mistral", dict(head_dim=32, sliding_window=None)),
    "llama_bias": ("Llama", dict(attention_bias=True)),
}
SERVED = ["llama3", "qwen2", "mistral"]


def make_hf(path, family: str, seed: int = 0, **overrides):
  """A tiny random transformers model of `family` saved to `path`. Biases and norm weights are
  randomized too (transformers starts them at 0 and 1, where a loader mistake would hide)."""
  import transformers
  name, kw = FAMILIES[family]
  kw = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
            max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
            initializer_range=0.1, **kw)
  kw.update(overrides)
  torch.manual_seed(seed)
  model = getattr(transformers, f"{name}ForCausalLM")(
      getattr(transformers, f"{name}Config")(**kw)).eval()
  with torch.no_grad():
    for pname, p in model.named_parameters():
      if pname.endswith(".bias"):
        p.normal_(0.0, 0.1)
      elif "norm" in pname:
        p.copy_(1.0 + 0.1 * torch.randn_like(p))
  model.save_pretrained(str(path))
  return model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  """family -> (checkpoint dir, torch model), made on first use."""
  cache = {}

  def get(family):
    if family not in cache:
      path = tmp_path_factory.mktemp(family)
      cache[family] = (str(path), make_hf(path, family))
    return cache[family]
  return get


def _dense_logits(cfg, params, ids, pad_to=64):
  """pdjax's no-cache forward; zero padding after the prompt leaves causal logits unchanged."""
  fwd = jax.jit(lambda p, t: Llama(cfg, mode="dense").apply(
      p, t, (), {"positions": jnp.arange(pad_to)}, jnp.arange(pad_to))[0])
  return np.asarray(fwd(params, jnp.array(ids + [0] * (pad_to - len(ids)))))[:len(ids)]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_dense_logits_match_hf(models, family):
  path, model = models(family)
  cfg, params = load_hf_checkpoint(path)
  assert (cfg.qkv_bias, cfg.o_proj_bias) == {"qwen2": (True, False),
                                             "llama_bias": (True, True)}.get(family, (False, False))
  assert cfg.tie_word_embeddings == (family == "qwen2")
  for ids in PROMPTS:
    with torch.no_grad():
      hf = model(torch.tensor([ids])).logits[0].numpy()
    np.testing.assert_allclose(_dense_logits(cfg, params, ids), hf, atol=2e-5, rtol=0)


def _options():
  return EngineOptions(page_size=8, num_pages=40, max_model_len=96, prefill_buckets=(64,),
                       max_prefill_seqs=4, decode_buckets=(4,), dtype="float32", seed=0)


@pytest.mark.parametrize("mode", ["colocated", "disaggregated"])
@pytest.mark.parametrize("family", [SERVED[0]] + [pytest.param(f, marks=pytest.mark.slow)
                                                  for f in SERVED[1:]])
def test_greedy_tokens_match_hf_generate(models, family, mode):
  path, model = models(family)
  cfg = config_from_hf(path, max_model_len=96)
  params = host_params(cfg, checkpoint=path, seed=0, dtype="float32")
  d = jax.devices()
  # The decode TP1 instance sits on the colocated one's device: its programs hit the cache.
  tiers, devices = (([("colocated", 1, 1)], d) if mode == "colocated" else
                    ([("prefill", 1, 2), ("decode", 1, 1)], d[1:3] + d[:1]))
  instances = build_instances(tiers, cfg, params, _options(), devices)
  reqs = [Request(id=f"p{i}", arrival_s=0.0, prompt_ids=ids, eos_ids=(2,),
                  sampling=SamplingParams(max_new_tokens=MAX_NEW))
          for i, ids in enumerate(PROMPTS)]
  result = serving.serve(mode, instances, reqs)
  assert [r.status for r in result.requests] == [Status.FINISHED] * len(PROMPTS)
  if mode == "disaggregated":
    assert result.transfers and all(t["ok"] for t in result.transfers)
  for r, ids in zip(result.requests, PROMPTS):
    with torch.no_grad():
      hf = model.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False,
                          eos_token_id=2, pad_token_id=0)[0, len(ids):].tolist()
    assert r.output_ids == hf


def test_llama3_rope_frequencies_match_transformers(models):
  from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
  path, model = models("llama3")
  cfg = config_from_hf(path)
  ours, theirs = rope_inv_freq(cfg), ROPE_INIT_FUNCTIONS["llama3"](model.config)[0].numpy()
  np.testing.assert_allclose(ours, theirs, rtol=2e-7, atol=0)
  plain = rope_inv_freq(dataclasses.replace(cfg, rope_scaling=None))
  kept, divided = ours == plain, np.isclose(ours, plain / 8.0, rtol=1e-6, atol=0)
  assert kept.any() and divided.any() and (~kept & ~divided).any()   # all three llama3 bands


def _write_config(src: str, dst, **changes) -> str:
  """A copy of checkpoint `src` whose config.json has `changes` (None deletes a key)."""
  shutil.copytree(src, dst)
  with open(os.path.join(src, "config.json")) as f:
    hf = json.load(f)
  for k, v in changes.items():
    if v is None:
      hf.pop(k, None)
    else:
      hf[k] = v
  with open(os.path.join(dst, "config.json"), "w") as f:
    json.dump(hf, f)
  return str(dst)


def test_rope_parameters_and_older_rope_scaling_read_the_same(models, tmp_path):
  path, _ = models("llama3")
  cfg = config_from_hf(path)
  assert cfg.rope_theta == 500000.0 and cfg.rope_scaling.factor == 8.0
  assert cfg.rope_scaling.original_max_position_embeddings == 64
  new = _write_config(path, tmp_path / "new", rope_theta=None, rope_scaling=None,
                      rope_parameters={**LLAMA3_ROPE, "rope_theta": 500000.0})
  old_rope = {k: v for k, v in LLAMA3_ROPE.items() if k != "rope_type"}
  old = _write_config(path, tmp_path / "old", rope_parameters=None, rope_theta=500000.0,
                      rope_scaling={**old_rope, "type": "llama3"})
  assert config_from_hf(new) == config_from_hf(old) == cfg


def _refusal(path: str, **kw) -> str:
  with pytest.raises(ValueError) as e:
    load_hf_checkpoint(path, **kw)
  return str(e.value)


def test_unsupported_configs_are_refused_with_one_line(models, tmp_path):
  llama, _ = models("llama3")
  assert _refusal(_write_config(llama, tmp_path / "a", model_type="gemma")) == (
      "model.checkpoint: model_type='gemma' is not supported (supported: llama, mistral, qwen2)")
  assert _refusal(_write_config(llama, tmp_path / "b", rope_scaling=None, rope_parameters={
      "rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0})) == (
      "model.checkpoint: rope type 'yarn' is not supported (supported: default, llama3)")
  assert _refusal(_write_config(llama, tmp_path / "c", mlp_bias=True)) == (
      "model.checkpoint: mlp_bias=True is not supported")
  assert _refusal(_write_config(llama, tmp_path / "d", hidden_act="gelu")) == (
      "model.checkpoint: hidden_act='gelu' is not supported (supported: silu)")
  # Tensors the config gives no place to (q/k/v/o biases of 2 layers, attention_bias=false).
  bias = _write_config(models("llama_bias")[0], tmp_path / "e", attention_bias=False)
  assert _refusal(bias) == ("model.checkpoint: 8 tensor(s) the model has no place for, "
                            "e.g. model.layers.0.self_attn.k_proj.bias")


def test_sliding_window_is_refused_below_max_model_len(models, tmp_path):
  mistral, _ = models("mistral")
  windowed = _write_config(mistral, tmp_path / "w", sliding_window=64)
  msg = ("model.checkpoint: sliding_window=64 is smaller than max_model_len=96 "
         "(sliding-window attention is not implemented)")
  assert _refusal(windowed, max_model_len=96) == msg
  with pytest.raises(ValueError) as e:
    config_from_hf(windowed, max_model_len=96)
  assert str(e.value) == msg
  cfg = config_from_hf(windowed, max_model_len=64)            # the window covers every sequence
  assert cfg.sliding_window == 64
  # A caller that skips the check: the program attending 96 positions refuses to build.
  params = host_params(cfg, checkpoint=windowed, seed=0, dtype="float32")
  with pytest.raises(ValueError) as e:
    build_instances([("colocated", 1, 1)], cfg, params, _options())
  assert str(e.value) == ("sliding_window=64 is smaller than the 96 positions this program "
                          "attends (sliding-window attention is not implemented)")
  # Qwen2: the window counts only when use_sliding_window puts some layer on it.
  qwen, _ = models("qwen2")
  assert config_from_hf(qwen, max_model_len=96).sliding_window is None   # Qwen2.5 style
  on = _write_config(qwen, tmp_path / "q", use_sliding_window=True, sliding_window=32,
                     max_window_layers=1, layer_types=None)
  assert _refusal(on, max_model_len=96) == (
      "model.checkpoint: sliding_window=32 is smaller than max_model_len=96 "
      "(sliding-window attention is not implemented)")
  off = _write_config(qwen, tmp_path / "q2", use_sliding_window=True, sliding_window=32,
                      max_window_layers=2, layer_types=None)
  assert config_from_hf(off, max_model_len=96).sliding_window is None


def test_config_validation_refuses_a_window_shorter_than_kv_max_model_len(models, tmp_path):
  """The run's config check applies the window against kv.max_model_len: one line, no jax."""
  from pdjax import config as config_lib
  mistral, _ = models("mistral")
  windowed = _write_config(mistral, tmp_path / "w", sliding_window=64)
  cfg = config_lib.load_config_module("configs/default.py").get_config("smoke")
  cfg.model.checkpoint, cfg.kv.max_model_len = windowed, 128
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg)
  assert str(e.value) == ("model.checkpoint: sliding_window=64 is smaller than "
                          "max_model_len=128 (sliding-window attention is not implemented)")


def test_a_checkpoint_missing_a_tensor_is_one_line_from_the_cli(tmp_path):
  """Bad input at load time (a tensor missing from the safetensors): exit 2 with one line
  naming the tensor and the folder, no traceback."""
  import subprocess
  import sys
  from safetensors.numpy import load_file, save_file
  from conftest import make_hf_llama
  make_hf_llama(tmp_path / "ckpt")
  (shard,) = [p for p in os.listdir(tmp_path / "ckpt") if p.endswith(".safetensors")]
  tensors = load_file(str(tmp_path / "ckpt" / shard))
  del tensors["model.layers.1.mlp.up_proj.weight"]
  save_file(tensors, str(tmp_path / "ckpt" / shard), metadata={"format": "pt"})
  proc = subprocess.run(
      [sys.executable, "-m", "pdjax.run", "--config=configs/default.py:smoke",
       f"--config.model.checkpoint={tmp_path / 'ckpt'}", "--config.kv.max_model_len=256",
       "--config.progress=False", f"--workdir={tmp_path / 'out'}"],
      capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines()[-1] == (
      f"config error: model.checkpoint: tensor model.layers.1.mlp.up_proj.weight missing from "
      f"{tmp_path / 'ckpt'}")
