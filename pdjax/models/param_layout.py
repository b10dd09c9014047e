"""How an instance holds the Llama parameters: "stacked" (layers stacked [L, ...], one layer
body run by nn.scan: TPU, GPU, TP > 1) or "unrolled" (one tree per layer, `layers_0`...,
each matmul kernel cut into contiguous column blocks `kernel_0`...: a CPU TP1 instance).

Why unrolled on CPU: a scanned layer reads its weights through a dynamic slice of the stacked
arrays, which XLA on CPU copies out before each dot (every weight read three times a step);
one array per layer feeds the dots directly. Why column blocks: XLA on CPU runs one dot on one
thread, and independent dots concurrently (models/split_dense.py). The same computation, in
kernels that may round in another order (float32, ~1e-7; greedy tokens are checked against
HF by the engine's parity tests). Checkpoints, shardings of the stacked layout and the
reference keep the stacked tree; `to_layout` converts it once, when an instance places its
parameters.
"""

from __future__ import annotations

import math

from pdjax.models.split_dense import column_blocks

LAYOUTS = ("stacked", "unrolled")
# Leading kernel dims that are contracted (inputs): o_proj takes [heads, head_dim].
_INPUT_DIMS = {"o_proj": 2}
_KERNELS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def split_kernel(kernel, input_dims: int, splits: int) -> dict:
  """{"kernel_i": [K, n_i]}: kernel [in..., out...] as a matrix, cut into column blocks (each
  a contiguous copy)."""
  k = math.prod(kernel.shape[:input_dims])
  matrix = kernel.reshape(k, -1)
  return {f"kernel_{i}": matrix[:, a:b].copy() for i, (a, b)
          in enumerate(column_blocks(matrix.shape[1], splits))}


def to_layout(params, num_layers: int, layout: str, splits: int = 1):
  """The stacked parameter tree {"params": {...}} in `layout` (numpy or jax arrays alike)."""
  if layout not in LAYOUTS:
    raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
  if layout == "stacked":
    return params
  p = params["params"]
  out = {name: tree for name, tree in p.items()
         if name not in ("layers", "lm_head", "embed_tokens")}
  table = p["embed_tokens"]["embedding"]
  if splits > 1 and "lm_head" not in p:   # tied: the table is the head too (SplitEmbed)
    out["embed_tokens"] = {f"embedding_{i}": table[a:b].copy()
                           for i, (a, b) in enumerate(column_blocks(table.shape[0], splits))}
  else:
    out["embed_tokens"] = p["embed_tokens"]
  for layer in range(num_layers):
    tree = {}
    for name, leaves in p["layers"].items():
      if name in _KERNELS and splits > 1:
        tree[name] = split_kernel(leaves["kernel"][layer], _INPUT_DIMS.get(name, 1), splits)
      elif isinstance(leaves, dict):
        tree[name] = {leaf: value[layer] for leaf, value in leaves.items()}
      else:                  # a layer's own param (q_bias, ...): one array [L, ...]
        tree[name] = leaves[layer]
    out[f"layers_{layer}"] = tree
  if "lm_head" in p:
    out["lm_head"] = (split_kernel(p["lm_head"]["kernel"], 1, splits) if splits > 1
                      else p["lm_head"])
  return {"params": out}
