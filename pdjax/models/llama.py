"""A Llama-family decoder in Flax (linen): RMSNorm, RoPE, grouped-query attention, SwiGLU.

One model with options (LlamaConfig) covers the families: llama3 RoPE scaling, q/k/v (and
o_proj) biases. Bias params are named q_bias, k_bias, v_bias, o_bias, beside the projections.

The model is a pure function of its parameters, the new tokens, the KV page pools and the
attention metadata; it returns logits for the selected rows and the updated pools. Three modes
share one set of weights:
  "prefill": packed ragged tokens of several sequences, causal attention over pages;
  "decode":  one new token per sequence, attention over pages;
  "dense":   one sequence, full causal attention, no cache (the no-cache reference).
Layers are stacked with `nn.scan` (one compiled layer body, fast compiles, params [layers, ...]).
The KV pools [layers, ...] ride in the scan's carry and each layer writes its slots in place at
its own index: passed as scanned inputs and outputs instead, XLA copies both whole pools on
every step (on CPU that copy cost more than the tiny model's matmuls).
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from kernels_pallas import xla_attention
from kernels_pallas.attention_ops import AttentionOps
from pdjax.models.llama_config import LlamaConfig
from pdjax.models.param_layout import LAYOUTS

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


def rope_inv_freq(cfg: LlamaConfig) -> np.ndarray:
  """RoPE inverse frequencies [head_dim / 2], float32, computed on the host op for op as
  transformers does (modeling_rope_utils: default, and _compute_llama3_parameters); equal bits
  but for a rare last-ulp difference of torch's vectorized float32 pow."""
  d = cfg.head_dim
  exponent = np.arange(0, d, 2).astype(np.float32) / np.float32(d)
  # float32 inputs, pow rounded once from float64 (torch's float32 pow, to within an ulp).
  power = (np.float64(np.float32(cfg.rope_theta)) ** exponent.astype(np.float64))
  inv_freq = np.float32(1.0) / power.astype(np.float32)
  s = cfg.rope_scaling
  if s is None:
    return inv_freq
  low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
  high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
  # torch evaluates scalar / tensor as reciprocal(tensor) * scalar; so do we, for equal bits.
  wavelen = (np.float32(1.0) / inv_freq) * np.float32(2 * math.pi)
  scaled = np.where(wavelen > low_wavelen, inv_freq / np.float32(s.factor), inv_freq)
  ratio = (np.float32(1.0) / wavelen) * np.float32(s.original_max_position_embeddings)
  smooth = ((ratio - np.float32(s.low_freq_factor))
            / np.float32(s.high_freq_factor - s.low_freq_factor))
  smoothed = (1 - smooth) * scaled / np.float32(s.factor) + smooth * scaled
  medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
  return np.where(medium, smoothed, scaled).astype(np.float32)


def apply_rope(x, positions, inv_freq):
  """Rotary embedding, Hugging Face "rotate_half" layout. x [T, heads, D], positions [T]."""
  d = x.shape[-1]
  freqs = positions.astype(jnp.float32)[:, None] * jnp.asarray(inv_freq)[None, :]   # [T, D/2]
  emb = jnp.concatenate([freqs, freqs], axis=-1)[:, None, :]            # [T, 1, D]
  cos, sin = jnp.cos(emb), jnp.sin(emb)
  x32 = x.astype(jnp.float32)
  rotated = jnp.concatenate([-x32[..., d // 2:], x32[..., :d // 2]], axis=-1)
  return (x32 * cos + rotated * sin).astype(x.dtype)


def write_layer_kv(k_pool, v_pool, layer, k, v, slot_mapping):
  """Scatters one layer's new keys/values into the whole pools, in place.

  k_pool, v_pool: [L, KVH, P, page_size, D]; layer: int32 scalar; k, v: [T, KVH, D];
  slot_mapping: int32 [T] flat slots `page * page_size + offset`, out of range for padding
  (dropped).

  A one-token write (a decode step of batch 1) is padded to two, the second dropped: XLA turns
  a one-index scatter into a dynamic-update-slice, and on CPU that, inside the layer loop,
  copied both whole pools every layer (a SmolLM2 batch-1 step took 4.6 s instead of ~60 ms)."""
  num_layers, kvh, num_pages, page_size, d = k_pool.shape
  if slot_mapping.shape[0] == 1:
    slot_mapping = jnp.concatenate([slot_mapping,
                                    jnp.full((1,), num_pages * page_size, jnp.int32)])
    k, v = (jnp.concatenate([x, x]) for x in (k, v))

  def scatter(pool, new):
    flat = pool.reshape(num_layers, kvh, num_pages * page_size, d)
    flat = flat.at[layer, :, slot_mapping].set(new.astype(pool.dtype), mode="drop")
    return flat.reshape(pool.shape)

  return scatter(k_pool, k), scatter(v_pool, v)


class DecoderLayer(nn.Module):
  cfg: LlamaConfig
  mode: str
  dtype: jnp.dtype = jnp.float32
  attention: AttentionOps = AttentionOps()

  @nn.compact
  def __call__(self, carry, layer, meta):
    """carry: (x [T, hidden], kv: () or the (k, v) pools [L, KVH, P, ps, D]); layer: this
    layer's index into the pools."""
    x, kv = carry
    cfg, dt = self.cfg, self.dtype
    dense = lambda feats, name, axis=-1: nn.DenseGeneral(
        feats, axis=axis, use_bias=False, dtype=dt, param_dtype=dt, name=name)

    def biased(y, name, on):   # a separate param, so the TP layout of the kernel is untouched
      if not on:
        return y
      return y + self.param(name, nn.initializers.zeros, y.shape[1:], dt)

    h = RMSNorm(cfg.rms_norm_eps, dt, name="input_layernorm")(x)
    q = biased(dense((cfg.num_heads, cfg.head_dim), "q_proj")(h), "q_bias", cfg.qkv_bias)
    k = biased(dense((cfg.num_kv_heads, cfg.head_dim), "k_proj")(h), "k_bias", cfg.qkv_bias)
    v = biased(dense((cfg.num_kv_heads, cfg.head_dim), "v_proj")(h), "v_bias", cfg.qkv_bias)
    inv_freq = rope_inv_freq(cfg)                           # a host constant, folded in
    q = apply_rope(q, meta["positions"], inv_freq)
    k = apply_rope(k, meta["positions"], inv_freq)

    if self.mode == "dense":
      out = xla_attention.dense_causal_attention(q, k, v)
    else:
      kv = write_layer_kv(*kv, layer, k, v, meta["slot_mapping"])
      # The whole pools and this layer's index: the XLA attention reads the layer in place
      # (sliced out here, XLA on CPU copied both pools' layer every layer of every step).
      if self.mode == "decode":
        out = self.attention.decode(q, kv[0], kv[1], meta["lengths"], meta["page_indices"],
                                    layer=layer)
      else:
        out = self.attention.ragged(q, kv[0], kv[1], meta["kv_lens"], meta["page_indices"],
                                    meta["cu_q_lens"], meta["num_seqs"], layer=layer)
    x = x + biased(dense(cfg.hidden_size, "o_proj", axis=(-2, -1))(out), "o_bias",
                   cfg.o_proj_bias)

    h = RMSNorm(cfg.rms_norm_eps, dt, name="post_attention_layernorm")(x)
    gate = dense(cfg.intermediate_size, "gate_proj")(h)
    up = dense(cfg.intermediate_size, "up_proj")(h)
    x = x + dense(cfg.hidden_size, "down_proj")(nn.silu(gate) * up)
    return (x, kv), None


class Llama(nn.Module):
  """tokens [T] -> (logits [len(logits_indices), vocab] float32, updated kv pools)."""

  cfg: LlamaConfig
  mode: str = "prefill"
  dtype: jnp.dtype = jnp.float32
  attention: AttentionOps = AttentionOps()   # which paged attention runs
  layout: str = "stacked"   # how the params are held (param_layout.py): "stacked" layers run
                            # by nn.scan, or "unrolled" (one tree per layer; CPU TP1)
  layers: tuple[int, int] | None = None   # run only layers [a, b) (a layer group: KV
                            # streaming, engine/layer_groups.py): from layer a > 0 the input is
                            # the hidden state [T, hidden], not tokens; below the last layer the
                            # output is the hidden state, not logits. Stacked params are then
                            # those of layers a..b only (layer_group_params).

  @nn.compact
  def __call__(self, tokens, kv, meta, logits_indices):
    if self.mode not in MODES:
      raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
    cfg = self.cfg
    if cfg.sliding_window is not None:   # a backstop for callers that skip check_max_model_len
      span = (tokens.shape[0] if self.mode == "dense"
              else meta["page_indices"].shape[-1] * kv[0].shape[-2])
      if span > cfg.sliding_window:
        raise ValueError(f"sliding_window={cfg.sliding_window} is smaller than the {span} "
                         f"positions this program attends (sliding-window attention is not "
                         f"implemented)")
    if self.layout not in LAYOUTS:
      raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
    first, last = self.layers or (0, cfg.num_layers)
    if not 0 <= first < last <= cfg.num_layers:
      raise ValueError(f"layers must be a range within [0, {cfg.num_layers}), got "
                       f"{self.layers}")
    embed = nn.Embed(cfg.vocab_size, cfg.hidden_size, dtype=self.dtype,
                     param_dtype=self.dtype, name="embed_tokens")
    x = embed(tokens) if first == 0 else tokens
    if self.layout == "unrolled":   # one layer body per layer, each reading its own arrays
      for layer in range(first, last):
        (x, kv), _ = DecoderLayer(cfg, self.mode, self.dtype, self.attention,
                                  name=f"layers_{layer}")((x, kv), jnp.int32(layer), meta)
    else:
      layers = nn.scan(DecoderLayer, variable_axes={"params": 0}, split_rngs={"params": True},
                       in_axes=(0, nn.broadcast), length=last - first)
      (x, kv), _ = layers(cfg, self.mode, self.dtype, self.attention, name="layers")(
          (x, kv), jnp.arange(first, last), meta)
    if last < cfg.num_layers:
      return x, kv
    x = RMSNorm(cfg.rms_norm_eps, self.dtype, name="norm")(x)
    x = x[logits_indices]
    if cfg.tie_word_embeddings:
      logits = embed.attend(x)
    else:
      logits = nn.Dense(cfg.vocab_size, use_bias=False, dtype=self.dtype,
                        param_dtype=self.dtype, name="lm_head")(x)
    return logits.astype(jnp.float32), kv


def layer_group_params(params, layers: tuple[int, int], layout: str = "stacked"):
  """The params a `Llama(layers=layers)` applies: stacked layer params sliced to the group's
  layers (inside a jitted program: a static slice); unrolled ones are named per layer and
  taken as they are."""
  if layout != "stacked":
    return params
  first, last = layers
  inner = dict(params["params"])
  inner["layers"] = jax.tree_util.tree_map(lambda p: p[first:last], inner["layers"])
  return {**params, "params": inner}


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
