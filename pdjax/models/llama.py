"""A Llama-family decoder in Flax (linen): RMSNorm, RoPE, grouped-query attention, SwiGLU.

The model is a pure function of its parameters, the new tokens, the KV page pools and the
attention metadata; it returns logits for the selected rows and the updated pools. Three modes
share one set of weights:
  "prefill": packed ragged tokens of several sequences, causal attention over pages;
  "decode":  one new token per sequence, attention over pages;
  "dense":   one sequence, full causal attention, no cache (the no-cache reference).
Layers are stacked with `nn.scan` (one compiled layer body, fast compiles, params [layers, ...]).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from kernels_pallas import xla_attention
from kernels_pallas.attention_ops import AttentionOps
from pdjax.models.llama_config import LlamaConfig

MODES = ("prefill", "decode", "dense")


class RMSNorm(nn.Module):
  eps: float
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    weight = self.param("weight", nn.initializers.ones, (x.shape[-1],), self.dtype)
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return weight * normed.astype(x.dtype)


def apply_rope(x, positions, theta: float):
  """Rotary embedding, Hugging Face "rotate_half" layout. x [T, heads, D], positions [T]."""
  d = x.shape[-1]
  inv_freq = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
  freqs = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]    # [T, D/2]
  emb = jnp.concatenate([freqs, freqs], axis=-1)[:, None, :]            # [T, 1, D]
  cos, sin = jnp.cos(emb), jnp.sin(emb)
  x32 = x.astype(jnp.float32)
  rotated = jnp.concatenate([-x32[..., d // 2:], x32[..., :d // 2]], axis=-1)
  return (x32 * cos + rotated * sin).astype(x.dtype)


class DecoderLayer(nn.Module):
  cfg: LlamaConfig
  mode: str
  dtype: jnp.dtype = jnp.float32
  attention: AttentionOps = AttentionOps()

  @nn.compact
  def __call__(self, x, layer_kv, meta):
    cfg, dt = self.cfg, self.dtype
    dense = lambda feats, name, axis=-1: nn.DenseGeneral(
        feats, axis=axis, use_bias=False, dtype=dt, param_dtype=dt, name=name)

    h = RMSNorm(cfg.rms_norm_eps, dt, name="input_layernorm")(x)
    q = dense((cfg.num_heads, cfg.head_dim), "q_proj")(h)                # [T, H, D]
    k = dense((cfg.num_kv_heads, cfg.head_dim), "k_proj")(h)             # [T, KVH, D]
    v = dense((cfg.num_kv_heads, cfg.head_dim), "v_proj")(h)
    q = apply_rope(q, meta["positions"], cfg.rope_theta)
    k = apply_rope(k, meta["positions"], cfg.rope_theta)

    if self.mode == "dense":
      out = xla_attention.dense_causal_attention(q, k, v)
    else:
      k_pages, v_pages = xla_attention.write_kv(*layer_kv, k, v, meta["slot_mapping"])
      layer_kv = (k_pages, v_pages)
      if self.mode == "decode":
        out = self.attention.decode(q, k_pages, v_pages, meta["lengths"], meta["page_indices"])
      else:
        out = self.attention.ragged(q, k_pages, v_pages, meta["kv_lens"], meta["page_indices"],
                                    meta["cu_q_lens"], meta["num_seqs"])
    x = x + dense(cfg.hidden_size, "o_proj", axis=(-2, -1))(out)

    h = RMSNorm(cfg.rms_norm_eps, dt, name="post_attention_layernorm")(x)
    gate = dense(cfg.intermediate_size, "gate_proj")(h)
    up = dense(cfg.intermediate_size, "up_proj")(h)
    x = x + dense(cfg.hidden_size, "down_proj")(nn.silu(gate) * up)
    return x, layer_kv


class Llama(nn.Module):
  """tokens [T] -> (logits [len(logits_indices), vocab] float32, updated kv pools)."""

  cfg: LlamaConfig
  mode: str = "prefill"
  dtype: jnp.dtype = jnp.float32
  attention: AttentionOps = AttentionOps()   # which paged attention runs

  @nn.compact
  def __call__(self, tokens, kv, meta, logits_indices):
    if self.mode not in MODES:
      raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
    cfg = self.cfg
    embed = nn.Embed(cfg.vocab_size, cfg.hidden_size, dtype=self.dtype,
                     param_dtype=self.dtype, name="embed_tokens")
    x = embed(tokens)
    layers = nn.scan(DecoderLayer, variable_axes={"params": 0}, split_rngs={"params": True},
                     in_axes=(0, nn.broadcast), length=cfg.num_layers)
    x, kv = layers(cfg, self.mode, self.dtype, self.attention, name="layers")(x, kv, meta)
    x = RMSNorm(cfg.rms_norm_eps, self.dtype, name="norm")(x)
    x = x[logits_indices]
    if cfg.tie_word_embeddings:
      logits = embed.attend(x)
    else:
      logits = nn.Dense(cfg.vocab_size, use_bias=False, dtype=self.dtype,
                        param_dtype=self.dtype, name="lm_head")(x)
    return logits.astype(jnp.float32), kv


def init_params(cfg: LlamaConfig, seed: int, dtype=jnp.float32):
  """Seeded random parameters (normal, std 0.02 like HF's initializer_range)."""
  model = Llama(cfg, mode="dense", dtype=dtype)
  tokens = jnp.zeros((1,), jnp.int32)
  meta = {"positions": jnp.zeros((1,), jnp.int32)}
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(seed), tokens, (), meta,
                                             jnp.zeros((1,), jnp.int32)))
  leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  out = []
  for key, (path, leaf) in zip(keys, leaves):
    name = jax.tree_util.keystr(path)
    if "layernorm" in name or name.endswith("['norm']['weight']"):
      out.append(jnp.ones(leaf.shape, dtype))
    else:
      out.append((0.02 * jax.random.normal(key, leaf.shape, jnp.float32)).astype(dtype))
  return jax.tree_util.tree_unflatten(treedef, out)
