"""LlamaConfig: the model hyper-parameters, presets and the Hugging Face config.json mapping.

One decoder covers the Llama family: Llama 2 / 3 / 3.1+ (llama3 RoPE scaling), Mistral (no
sliding window in use) and Qwen2 / 2.5 (q/k/v bias). Whatever config.json asks for that the
model does not implement is refused with one line naming it, never loaded approximately.
Pure Python (no jax) so that config validation can read head counts before jax starts.
"""

from __future__ import annotations

import dataclasses
import json
import os


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """Llama 3.1 RoPE frequency scaling (transformers' rope_type "llama3", the one implemented)."""
  rope_type: str
  factor: float
  low_freq_factor: float
  high_freq_factor: float
  original_max_position_embeddings: int


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
  rope_scaling: RopeScaling | None = None   # None: plain RoPE
  qkv_bias: bool = False                    # Qwen2; Llama's attention_bias
  o_proj_bias: bool = False                 # Llama's attention_bias
  sliding_window: int | None = None         # not implemented: only checked (check_max_model_len)

  def __post_init__(self):
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} is not a multiple of "
                       f"num_kv_heads={self.num_kv_heads}")

  def check_max_model_len(self, max_model_len: int) -> None:
    """Full attention equals the model's sliding-window attention only while every sequence
    fits in the window: refuse longer serving lengths rather than attend differently."""
    if self.sliding_window is not None and self.sliding_window < max_model_len:
      raise ValueError(f"model.checkpoint: sliding_window={self.sliding_window} is smaller than "
                       f"max_model_len={max_model_len} (sliding-window attention is not "
                       f"implemented)")


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
    # SmolLM2-135M-Instruct's shapes (configs/smollm2.py serves the real weights; this preset
    # is for the simulator and ahead-of-time lowering): GQA 3, head_dim 64, tied embeddings.
    "smollm2_135m": LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
                                rope_theta=100000.0, rms_norm_eps=1e-5,
                                tie_word_embeddings=True, max_position_embeddings=8192,
                                bos_token_id=1, eos_token_ids=(2,)),
}


FAMILIES = ("llama", "mistral", "qwen2")   # config.json model_type values loaded
ROPE_TYPES = ("default", "llama3")


def _eos_tuple(value) -> tuple[int, ...]:
  if value is None:
    return ()
  if isinstance(value, (list, tuple)):
    return tuple(int(v) for v in value)
  return (int(value),)


def _refuse(what: str):
  raise ValueError(f"model.checkpoint: {what}")


def _rope(hf: dict) -> tuple[float, RopeScaling | None]:
  """(rope_theta, scaling) from `rope_parameters` (newer transformers) or `rope_scaling` plus a
  top-level `rope_theta` (older), with transformers' precedence and defaults."""
  rope = dict(hf.get("rope_scaling") or {})
  rope.update(hf.get("rope_parameters") or {})
  if any(isinstance(v, dict) for v in rope.values()):
    _refuse(f"rope_parameters per layer type ({', '.join(sorted(rope))}) are not supported")
  kind = rope.get("rope_type", rope.get("type", "default"))
  if kind not in ROPE_TYPES:
    _refuse(f"rope type {kind!r} is not supported (supported: {', '.join(ROPE_TYPES)})")
  partial = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
  if partial != 1.0:
    _refuse(f"partial_rotary_factor={partial} is not supported")
  theta = float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))
  if kind == "default":
    return theta, None
  # A top-level original_max_position_embeddings wins, as in transformers (Phi-3 style).
  orig = hf.get("original_max_position_embeddings",
                rope.get("original_max_position_embeddings", hf.get("max_position_embeddings")))
  missing = [k for k in ("factor", "low_freq_factor", "high_freq_factor") if k not in rope]
  if missing or orig is None:
    missing = missing or ["original_max_position_embeddings"]
    _refuse(f"rope type {kind!r} needs {', '.join(missing)}")
  return theta, RopeScaling(kind, float(rope["factor"]), float(rope["low_freq_factor"]),
                            float(rope["high_freq_factor"]), int(orig))


def _sliding_window(hf: dict, family: str, num_layers: int) -> int | None:
  """The attention window some layer uses, as transformers reads it (None: full attention)."""
  if family == "mistral":
    return hf.get("sliding_window")
  if family == "qwen2" and hf.get("use_sliding_window"):
    first = hf.get("max_window_layers", 28)
    types = hf.get("layer_types") or ["sliding_attention" if i >= first else "full_attention"
                                      for i in range(num_layers)]
    return hf.get("sliding_window") if "sliding_attention" in types else None
  return None


def config_from_hf(checkpoint_dir: str, max_model_len: int | None = None) -> LlamaConfig:
  """Reads a local Hugging Face `config.json` of a supported family (FAMILIES); refuses, with one
  line, anything the model does not implement. With max_model_len, also checks that serving
  length against a sliding window (LlamaConfig.check_max_model_len)."""
  path = os.path.join(checkpoint_dir, "config.json")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"model.checkpoint: no config.json in {checkpoint_dir}")
  with open(path) as f:
    hf = json.load(f)
  family = hf.get("model_type")
  if family not in FAMILIES:
    _refuse(f"model_type={family!r} is not supported (supported: {', '.join(FAMILIES)})")
  act = hf.get("hidden_act", "silu")
  if act != "silu":
    _refuse(f"hidden_act={act!r} is not supported (supported: silu)")
  if hf.get("mlp_bias"):
    _refuse("mlp_bias=True is not supported")
  attention_bias = family == "llama" and bool(hf.get("attention_bias"))
  rope_theta, rope_scaling = _rope(hf)
  heads = hf["num_attention_heads"]
  hidden = hf["hidden_size"]
  cfg = LlamaConfig(
      vocab_size=hf["vocab_size"],
      hidden_size=hidden,
      intermediate_size=hf["intermediate_size"],
      num_layers=hf["num_hidden_layers"],
      num_heads=heads,
      num_kv_heads=hf.get("num_key_value_heads") or heads,
      head_dim=hf.get("head_dim") or hidden // heads,
      rope_theta=rope_theta,
      rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
      tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
      max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
      bos_token_id=hf.get("bos_token_id"),
      eos_token_ids=_eos_tuple(hf.get("eos_token_id")),
      rope_scaling=rope_scaling,
      qkv_bias=family == "qwen2" or attention_bias,
      o_proj_bias=attention_bias,
      sliding_window=_sliding_window(hf, family, hf["num_hidden_layers"]),
  )
  if max_model_len is not None:
    cfg.check_max_model_len(max_model_len)
  return cfg
