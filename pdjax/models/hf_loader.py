"""Loads a local Hugging Face Llama-family checkpoint (config.json + *.safetensors) into pdjax.

Families: llama, mistral, qwen2 (see llama_config.config_from_hf for what is refused). Sharded
checkpoints (model-00001-of-0000N.safetensors + index) and single files both work: every
*.safetensors file in the folder is read. Torch Linear weights are [out, in]; our Flax kernels
are [in, out] with heads split out, and layers are stacked on a leading axis (nn.scan). Every
tensor in the checkpoint must be used: one the model has no place for is refused, not dropped.
"""

from __future__ import annotations

import glob
import os

import numpy as np
from safetensors import safe_open

from pdjax.models.llama_config import LlamaConfig, config_from_hf

# Tensors some checkpoints carry that the model recomputes (non-persistent buffers in torch).
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


def _read_tensors(checkpoint_dir: str) -> dict[str, np.ndarray]:
  files = sorted(glob.glob(os.path.join(checkpoint_dir, "*.safetensors")))
  if not files:
    raise FileNotFoundError(f"model.checkpoint: no *.safetensors in {checkpoint_dir}")
  tensors = {}
  for path in files:
    # framework="flax" reads bfloat16 too (numpy has no native bf16); pull back to host numpy.
    with safe_open(path, framework="flax") as f:
      for name in f.keys():
        tensors[name] = np.asarray(f.get_tensor(name))
  return tensors


def load_hf_checkpoint(checkpoint_dir: str, dtype=np.float32,
                       max_model_len: int | None = None) -> tuple[LlamaConfig, dict]:
  """Returns (config, params) with params as host numpy arrays in pdjax's layout. With
  max_model_len, a sliding window shorter than it is refused (config_from_hf)."""
  cfg = config_from_hf(checkpoint_dir, max_model_len=max_model_len)
  t = _read_tensors(checkpoint_dir)
  used = set()
  prefix = "model."
  h, kvh, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim

  def take(name):
    if name not in t:
      raise KeyError(f"model.checkpoint: tensor {name} missing from {checkpoint_dir}")
    used.add(name)
    return t[name].astype(np.float32)

  def stack(fn):
    return np.stack([fn(i) for i in range(cfg.num_layers)])

  def lin(i, name):
    return take(f"{prefix}layers.{i}.{name}.weight").T            # [in, out]

  def bias(name, shape):
    return stack(lambda i: take(f"{prefix}layers.{i}.{name}.bias").reshape(shape))

  layers = {
      "input_layernorm": {"weight": stack(lambda i: take(f"{prefix}layers.{i}.input_layernorm.weight"))},
      "post_attention_layernorm": {"weight": stack(
          lambda i: take(f"{prefix}layers.{i}.post_attention_layernorm.weight"))},
      "q_proj": {"kernel": stack(lambda i: lin(i, "self_attn.q_proj").reshape(-1, h, d))},
      "k_proj": {"kernel": stack(lambda i: lin(i, "self_attn.k_proj").reshape(-1, kvh, d))},
      "v_proj": {"kernel": stack(lambda i: lin(i, "self_attn.v_proj").reshape(-1, kvh, d))},
      "o_proj": {"kernel": stack(lambda i: lin(i, "self_attn.o_proj").reshape(h, d, -1))},
      "gate_proj": {"kernel": stack(lambda i: lin(i, "mlp.gate_proj"))},
      "up_proj": {"kernel": stack(lambda i: lin(i, "mlp.up_proj"))},
      "down_proj": {"kernel": stack(lambda i: lin(i, "mlp.down_proj"))},
  }
  if cfg.qkv_bias:
    layers["q_bias"] = bias("self_attn.q_proj", (h, d))
    layers["k_bias"] = bias("self_attn.k_proj", (kvh, d))
    layers["v_bias"] = bias("self_attn.v_proj", (kvh, d))
  if cfg.o_proj_bias:
    layers["o_bias"] = bias("self_attn.o_proj", (-1,))
  params = {
      "embed_tokens": {"embedding": take(f"{prefix}embed_tokens.weight")},
      "layers": layers,
      "norm": {"weight": take(f"{prefix}norm.weight")},
  }
  if cfg.tie_word_embeddings:
    used.add("lm_head.weight")      # some tied checkpoints store the shared matrix twice
  else:
    params["lm_head"] = {"kernel": take("lm_head.weight").T}
  unused = sorted(n for n in t if n not in used and not n.endswith(_IGNORED_SUFFIXES))
  if unused:
    raise ValueError(f"model.checkpoint: {len(unused)} tensor(s) the model has no place for, "
                     f"e.g. {unused[0]}")
  params = {"params": params}
  import jax.tree_util as tree_util  # local: keep module import light for config validation
  return cfg, tree_util.tree_map(lambda x: np.asarray(x, dtype=dtype), params)
