"""LlamaConfig: the model hyper-parameters, presets and the Hugging Face config.json mapping.

Pure Python (no jax) so that config validation can read head counts before jax starts.
"""

from __future__ import annotations

import dataclasses
import json
import os


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 10000.0
  rms_norm_eps: float = 1e-5
  tie_word_embeddings: bool = False
  max_position_embeddings: int = 4096
  bos_token_id: int | None = 1
  eos_token_ids: tuple[int, ...] = (2,)

  def __post_init__(self):
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} is not a multiple of "
                       f"num_kv_heads={self.num_kv_heads}")


PRESETS = {
    # The embedded default: small enough that 8 CPU instances compile and run in seconds, with
    # kv heads divisible by TP 1, 2 and 4 and grouped-query attention (2 query heads per kv head).
    "tiny": LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=2,
                        num_heads=8, num_kv_heads=4, head_dim=16, rope_theta=10000.0,
                        rms_norm_eps=1e-5, tie_word_embeddings=False,
                        max_position_embeddings=2048, bos_token_id=1, eos_token_ids=(2,)),
    # Published shapes, for the simulator (and for real runs with random weights on hardware
    # that holds them). Llama-1 65B stands in for DistServe's OPT-66B (66B-class, MHA).
    "llama2_7b": LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                             num_layers=32, num_heads=32, num_kv_heads=32, head_dim=128,
                             max_position_embeddings=4096),
    "llama2_13b": LlamaConfig(vocab_size=32000, hidden_size=5120, intermediate_size=13824,
                              num_layers=40, num_heads=40, num_kv_heads=40, head_dim=128,
                              max_position_embeddings=4096),
    "llama_65b": LlamaConfig(vocab_size=32000, hidden_size=8192, intermediate_size=22016,
                             num_layers=80, num_heads=64, num_kv_heads=64, head_dim=128,
                             max_position_embeddings=2048),
    "llama3_8b": LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                             num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
                             rope_theta=500000.0, max_position_embeddings=8192,
                             bos_token_id=128000, eos_token_ids=(128001, 128009)),
    "llama3_70b": LlamaConfig(vocab_size=128256, hidden_size=8192, intermediate_size=28672,
                              num_layers=80, num_heads=64, num_kv_heads=8, head_dim=128,
                              rope_theta=500000.0, max_position_embeddings=8192,
                              bos_token_id=128000, eos_token_ids=(128001, 128009)),
}


def _eos_tuple(value) -> tuple[int, ...]:
  if value is None:
    return ()
  if isinstance(value, (list, tuple)):
    return tuple(int(v) for v in value)
  return (int(value),)


def config_from_hf(checkpoint_dir: str) -> LlamaConfig:
  """Reads a local Hugging Face Llama-family `config.json`."""
  path = os.path.join(checkpoint_dir, "config.json")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"model.checkpoint: no config.json in {checkpoint_dir}")
  with open(path) as f:
    hf = json.load(f)
  if hf.get("rope_scaling"):
    raise ValueError(f"model.checkpoint: rope_scaling={hf['rope_scaling']} is not supported yet")
  if hf.get("attention_bias") or hf.get("mlp_bias"):
    raise ValueError("model.checkpoint: attention/mlp biases are not supported yet")
  heads = hf["num_attention_heads"]
  hidden = hf["hidden_size"]
  rope_theta = hf.get("rope_theta")
  if rope_theta is None:  # newer transformers nest it under rope_parameters
    rope_theta = (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0)
  return LlamaConfig(
      vocab_size=hf["vocab_size"],
      hidden_size=hidden,
      intermediate_size=hf["intermediate_size"],
      num_layers=hf["num_hidden_layers"],
      num_heads=heads,
      num_kv_heads=hf.get("num_key_value_heads") or heads,
      head_dim=hf.get("head_dim") or hidden // heads,
      rope_theta=float(rope_theta),
      rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
      tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
      max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
      bos_token_id=hf.get("bos_token_id"),
      eos_token_ids=_eos_tuple(hf.get("eos_token_id")),
  )
