"""How an instance holds the Llama parameters: "stacked" (layers stacked [L, ...], one layer
body run by nn.scan: TPU, GPU, TP > 1) or "unrolled" (one tree per layer, `layers_0`...: a CPU
TP1 instance).

Why unrolled on CPU: a scanned layer reads its weights through a dynamic slice of the stacked
arrays, which XLA on CPU copies out before each dot (every weight written and read again on
every step); one array per layer feeds the dots directly. The same computation, compiled into
other kernels (float32 rounding may differ at the 1e-7 level; greedy tokens are checked against
HF by the engine's parity tests), and a longer compile (each layer is its own code).
Checkpoints, the stacked shardings and the no-cache reference keep the stacked tree;
`to_layout` converts it once, when an instance places its parameters.

Tried and dropped: cutting each matmul into one column block per core, so that XLA's CPU
runtime runs the blocks concurrently. Alone, 30 SmolLM2-sized matmuls ran 2x faster; inside the
engine's step (whose dots XLA hands to its YNNPACK fusions) it measured no faster on the 2-core
host, and compiled slower.
"""

from __future__ import annotations

LAYOUTS = ("stacked", "unrolled")


def to_layout(params, num_layers: int, layout: str):
  """The stacked parameter tree {"params": {...}} in `layout` (numpy or jax arrays alike)."""
  if layout not in LAYOUTS:
    raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
  if layout == "stacked":
    return params
  p = params["params"]
  out = {name: tree for name, tree in p.items() if name != "layers"}
  for layer in range(num_layers):
    tree = {}
    for name, leaves in p["layers"].items():
      if isinstance(leaves, dict):
        tree[name] = {leaf: value[layer] for leaf, value in leaves.items()}
      else:                  # a layer's own param (q_bias, ...): one array [L, ...]
        tree[name] = leaves[layer]
    out[f"layers_{layer}"] = tree
  return {"params": out}


def to_stacked(params, num_layers: int, layout: str, stack=None):
  """The inverse of `to_layout`: the stacked tree from one in `layout`. stack: how to stack a
  list of arrays (numpy's by default; jnp.stack keeps device arrays on their device)."""
  if layout not in LAYOUTS:
    raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
  if layout == "stacked":
    return params
  if stack is None:
    import numpy as np
    stack = np.stack
  p = params["params"]
  first = p["layers_0"]
  layers = {}
  for name, leaves in first.items():
    if isinstance(leaves, dict):
      layers[name] = {leaf: stack([p[f"layers_{i}"][name][leaf] for i in range(num_layers)])
                      for leaf in leaves}
    else:
      layers[name] = stack([p[f"layers_{i}"][name] for i in range(num_layers)])
  out = {name: tree for name, tree in p.items() if not name.startswith("layers_")}
  out["layers"] = layers
  return {"params": out}
