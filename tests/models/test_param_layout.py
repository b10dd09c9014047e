"""The CPU parameter layout (pdjax/models/param_layout.py): one tree per layer, the same model."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pdjax.engine import mesh as mesh_lib
from pdjax.models.llama import Llama
from pdjax.models.param_layout import to_layout


def test_to_layout_structure(tiny_model):
  cfg, params = tiny_model          # 2 layers, hidden 128, 8 heads / 4 kv heads of 16, MLP 256
  out = to_layout(params, cfg.num_layers, "unrolled")["params"]
  assert sorted(out) == ["embed_tokens", "layers_0", "layers_1", "lm_head", "norm"]
  layer = out["layers_1"]
  assert layer["q_proj"]["kernel"].shape == (128, 8, 16)
  assert layer["o_proj"]["kernel"].shape == (8, 16, 128)
  assert layer["input_layernorm"]["weight"].shape == (128,)
  np.testing.assert_array_equal(layer["down_proj"]["kernel"],
                                params["params"]["layers"]["down_proj"]["kernel"][1])
  assert out["lm_head"] is params["params"]["lm_head"]
  assert to_layout(params, cfg.num_layers, "stacked") is params
  with pytest.raises(ValueError, match="^layout: expected one of"):
    to_layout(params, cfg.num_layers, "flat")


def test_a_layers_own_param_is_cut_by_layer(tiny_model):
  """Qwen2's q/k/v biases are arrays [L, ...] directly under "layers"."""
  cfg, params = tiny_model
  bias = np.arange(2 * 8 * 16, dtype=np.float32).reshape(2, 8, 16)
  tree = {"params": {**params["params"], "layers": {**params["params"]["layers"],
                                                    "q_bias": bias}}}
  out = to_layout(tree, cfg.num_layers, "unrolled")["params"]
  np.testing.assert_array_equal(out["layers_1"]["q_bias"], bias[1])


@pytest.mark.parametrize("tied", [False, True])
def test_unrolled_model_matches_the_stacked_one(tiny_model, tied):
  """Dense (no-cache) logits of 12 tokens. Unrolled and scanned layers are compiled into
  different kernels (float32 rounding at the 1e-7 level): they agree to within 1e-5 (greedy
  tokens: the engine's HF parity tests)."""
  cfg, params = tiny_model
  if tied:
    cfg = dataclasses.replace(cfg, tie_word_embeddings=True)
    params = {"params": {k: v for k, v in params["params"].items() if k != "lm_head"}}
  tokens = jnp.arange(3, 15, dtype=jnp.int32)
  meta = {"positions": jnp.arange(12)}
  last = jnp.arange(12)
  stacked = Llama(cfg, mode="dense").apply(params, tokens, (), meta, last)[0]
  unrolled = Llama(cfg, mode="dense", layout="unrolled").apply(
      to_layout(params, cfg.num_layers, "unrolled"), tokens, (), meta, last)[0]
  np.testing.assert_allclose(np.asarray(unrolled), np.asarray(stacked), rtol=1e-5, atol=1e-5)


def test_layout_by_platform_and_tp():
  cpu = jax.devices()
  assert mesh_lib.param_layout(cpu[:1]) == "unrolled"
  assert mesh_lib.param_layout(cpu[:2]) == "stacked"
  assert mesh_lib.param_layout(cpu[:1], "stacked") == "stacked"
  with pytest.raises(ValueError) as e:
    mesh_lib.param_layout(cpu[:2], "unrolled")
  assert str(e.value) == "model.param_layout='unrolled' needs TP1 instances, not TP2"
  with pytest.raises(ValueError) as e:
    mesh_lib.param_layout(cpu[:1], "flat")
  assert str(e.value) == ("model.param_layout='flat' is not one of "
                          "['auto', 'stacked', 'unrolled']")
