"""The CPU parameter layout (pdjax/models/param_layout.py, split_dense.py): one tree per layer,
matmul kernels in column blocks, a tied embedding in row blocks; bitwise the same model."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pdjax.engine import mesh as mesh_lib
from pdjax.models.llama import Llama
from pdjax.models.param_layout import to_layout
from pdjax.models.split_dense import SplitEmbed, column_blocks


def test_column_blocks():
  assert column_blocks(10, 3) == [(0, 3), (3, 7), (7, 10)]
  assert column_blocks(2, 4) == [(0, 1), (1, 2)]
  assert column_blocks(576, 1) == [(0, 576)]


def test_to_layout_structure(tiny_model):
  cfg, params = tiny_model          # 2 layers, hidden 128, 8 heads / 4 kv heads of 16, MLP 256
  out = to_layout(params, cfg.num_layers, "unrolled", 2)["params"]
  assert sorted(out) == ["embed_tokens", "layers_0", "layers_1", "lm_head", "norm"]
  layer = out["layers_1"]
  assert {k: v.shape for k, v in layer["q_proj"].items()} == {"kernel_0": (128, 64),
                                                              "kernel_1": (128, 64)}
  assert {k: v.shape for k, v in layer["o_proj"].items()} == {"kernel_0": (128, 64),
                                                              "kernel_1": (128, 64)}
  assert layer["input_layernorm"]["weight"].shape == (128,)
  np.testing.assert_array_equal(
      np.concatenate([layer["down_proj"]["kernel_0"], layer["down_proj"]["kernel_1"]], 1),
      params["params"]["layers"]["down_proj"]["kernel"][1])
  assert out["lm_head"]["kernel_1"].shape == (128, 256)
  assert out["embed_tokens"] is params["params"]["embed_tokens"]   # untied: the table as is
  assert to_layout(params, cfg.num_layers, "stacked") is params
  with pytest.raises(ValueError, match="^layout: expected one of"):
    to_layout(params, cfg.num_layers, "flat")


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("splits", [1, 2, 3])
def test_unrolled_model_matches_the_stacked_one(tiny_model, tied, splits):
  """Dense (no-cache) logits of 12 tokens. Unrolled and scanned layers, and one matmul or its
  column blocks, are compiled into different kernels (float32 rounding at the 1e-7 level):
  they agree to within 1e-5 (greedy tokens: the engine's HF parity tests)."""
  cfg, params = tiny_model
  if tied:
    cfg = dataclasses.replace(cfg, tie_word_embeddings=True)
    params = {"params": {k: v for k, v in params["params"].items() if k != "lm_head"}}
  tokens = jnp.arange(3, 15, dtype=jnp.int32)
  meta = {"positions": jnp.arange(12)}
  last = jnp.arange(12)
  stacked = Llama(cfg, mode="dense").apply(params, tokens, (), meta, last)[0]
  def unrolled(s):
    return np.asarray(Llama(cfg, mode="dense", layout="unrolled", matmul_splits=s).apply(
        to_layout(params, cfg.num_layers, "unrolled", s), tokens, (), meta, last)[0])
  np.testing.assert_allclose(unrolled(splits), np.asarray(stacked), rtol=1e-5, atol=1e-5)


def test_split_embedding_looks_up_every_block():
  table = np.arange(7 * 3, dtype=np.float32).reshape(7, 3)
  embed = SplitEmbed(7, 3, splits=3)
  blocks = {f"embedding_{i}": table[a:b] for i, (a, b) in enumerate(column_blocks(7, 3))}
  got = embed.apply({"params": blocks}, jnp.array([0, 2, 3, 6, 4], jnp.int32))
  np.testing.assert_array_equal(np.asarray(got), table[[0, 2, 3, 6, 4]])


def test_layout_by_platform_and_tp():
  cpu = jax.devices()
  cores = min(__import__("os").cpu_count(), mesh_lib.MAX_MATMUL_SPLITS)
  assert mesh_lib.param_layout(cpu[:1]) == ("unrolled", cores)
  assert mesh_lib.param_layout(cpu[:2]) == ("stacked", 1)
  assert mesh_lib.param_layout(cpu[:1], "stacked") == ("stacked", 1)
  with pytest.raises(ValueError) as e:
    mesh_lib.param_layout(cpu[:2], "unrolled")
  assert str(e.value) == "model.param_layout='unrolled' needs TP1 instances, not TP2"
  with pytest.raises(ValueError) as e:
    mesh_lib.param_layout(cpu[:1], "flat")
  assert str(e.value) == ("model.param_layout='flat' is not one of "
                          "['auto', 'stacked', 'unrolled']")
