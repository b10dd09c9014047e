"""Loads a local Hugging Face Llama-family checkpoint (config.json + *.safetensors) into pdjax.

Sharded checkpoints (model-00001-of-0000N.safetensors + index) and single files both work:
every *.safetensors file in the folder is read. Torch Linear weights are [out, in]; our Flax
kernels are [in, out] with heads split out, and layers are stacked on a leading axis (nn.scan).
"""

from __future__ import annotations

import glob
import os

import numpy as np
from safetensors import safe_open

from pdjax.models.llama_config import LlamaConfig, config_from_hf


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


def load_hf_checkpoint(checkpoint_dir: str, dtype=np.float32) -> tuple[LlamaConfig, dict]:
  """Returns (config, params) with params as host numpy arrays in pdjax's layout."""
  cfg = config_from_hf(checkpoint_dir)
  t = _read_tensors(checkpoint_dir)
  prefix = "model."
  h, kvh, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim

  def take(name):
    if name not in t:
      raise KeyError(f"model.checkpoint: tensor {name} missing from {checkpoint_dir}")
    return t[name].astype(np.float32)

  def stack(fn):
    return np.stack([fn(i) for i in range(cfg.num_layers)])

  def lin(i, name):
    return take(f"{prefix}layers.{i}.{name}.weight").T            # [in, out]

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
  params = {
      "embed_tokens": {"embedding": take(f"{prefix}embed_tokens.weight")},
      "layers": layers,
      "norm": {"weight": take(f"{prefix}norm.weight")},
  }
  if not cfg.tie_word_embeddings:
    params["lm_head"] = {"kernel": take("lm_head.weight").T}
  params = {"params": params}
  import jax.tree_util as tree_util  # local: keep module import light for config validation
  return cfg, tree_util.tree_map(lambda x: np.asarray(x, dtype=dtype), params)
