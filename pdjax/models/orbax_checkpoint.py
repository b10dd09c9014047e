"""pdjax's orbax checkpoint format: recognised, validated and restored shard by shard.

A folder written by `python -m pdjax.convert` holds `params/` (an orbax PyTree checkpoint of
pdjax's parameter tree, layers stacked), the HF config and tokenizer files, and the marker
`pdjax_checkpoint.json` (format version, stored dtype, model config, every tensor's shape).
Restoring onto an instance goes through abstract arrays that carry the instance's shardings:
orbax (tensorstore) reads each device's shards straight onto it, cast to the run's dtype as they
are read, so no full host copy of the model is made per instance.

Format detection and validation are pure Python (config validation runs before jax starts);
jax and orbax are imported only to restore.
"""

from __future__ import annotations

import glob
import json
import os

MARKER = "pdjax_checkpoint.json"
FORMAT = "pdjax-orbax"
VERSION = 1
PARAMS_DIR = "params"


def checkpoint_format(path: str) -> str:
  """"orbax" (a folder with the marker) or "hf" (config.json + *.safetensors); anything else
  raises ValueError with one line naming the folder. An orbax folder is also validated."""
  if os.path.isfile(os.path.join(path, MARKER)):
    read_marker(path)
    return "orbax"
  if (os.path.isfile(os.path.join(path, "config.json"))
      and glob.glob(os.path.join(path, "*.safetensors"))):
    return "hf"
  raise ValueError(f"model.checkpoint: {path} is neither a pdjax orbax checkpoint ({MARKER}) "
                   f"nor a Hugging Face one (config.json + *.safetensors)")


def read_marker(path: str) -> dict:
  """The marker of an orbax checkpoint folder, checked: right format and version, params/ there."""
  try:
    with open(os.path.join(path, MARKER)) as f:
      marker = json.load(f)
    ok = (isinstance(marker, dict) and marker.get("format") == FORMAT
          and marker.get("version") == VERSION and isinstance(marker.get("tensors"), dict))
  except (OSError, ValueError):
    ok = False
  if not ok:
    raise ValueError(f"model.checkpoint: {os.path.join(path, MARKER)} is not a {FORMAT} "
                     f"marker of version {VERSION}")
  if not os.path.isdir(os.path.join(path, PARAMS_DIR)):
    raise ValueError(f"model.checkpoint: {path} has {MARKER} but no {PARAMS_DIR}/ folder "
                     f"(convert again with python -m pdjax.convert)")
  return marker


def tensor_shapes(params) -> dict[str, list[int]]:
  """{"params/layers/q_proj/kernel": shape, ...} of a nested-dict parameter tree (the marker's
  "tensors", from which a restore rebuilds the tree without reading orbax metadata)."""
  out = {}

  def walk(prefix, node):
    if isinstance(node, dict):
      for key in sorted(node):
        walk(f"{prefix}/{key}" if prefix else key, node[key])
    else:
      out[prefix] = [int(n) for n in node.shape]
  walk("", params)
  return out


def _nest(flat: dict) -> dict:
  tree = {}
  for name, value in flat.items():
    *parents, leaf = name.split("/")
    node = tree
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = value
  return tree


class OrbaxParams:
  """A pdjax orbax checkpoint's parameters, restored on demand in `dtype` (the run's
  model.dtype; the checkpoint keeps the dtype it was converted in and is cast as it is read).

  Instances call it with their parameter shardings (`instance(shardings)`): each device gets
  only its shards. `abstract` is the tree of shapes and dtypes the shardings are built from.
  """

  def __init__(self, path: str, dtype):
    import jax
    import jax.numpy as jnp
    marker = read_marker(path)
    self.path, self.dtype = os.path.abspath(path), jnp.dtype(dtype)
    self.stored_dtype = marker.get("dtype")
    self.abstract = _nest({name: jax.ShapeDtypeStruct(tuple(shape), self.dtype)
                           for name, shape in marker["tensors"].items()})

  @property
  def params_dir(self) -> str:
    return os.path.join(self.path, PARAMS_DIR)

  def __call__(self, shardings):
    """The parameters on the devices of `shardings` (a tree of shardings like `abstract`)."""
    import jax
    import orbax.checkpoint as ocp
    target = jax.tree_util.tree_map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), self.abstract,
        shardings)
    with ocp.StandardCheckpointer() as ckpt:
      return ckpt.restore(self.params_dir, target)

  def host(self):
    """The whole tree as host numpy arrays in `dtype` (for host-side references, e.g. the debug
    check; serving never needs it)."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp
    args = jax.tree_util.tree_map(
        lambda a: ocp.RestoreArgs(restore_type=np.ndarray, dtype=a.dtype), self.abstract)
    with ocp.PyTreeCheckpointer() as ckpt:
      return ckpt.restore(self.params_dir, args=ocp.args.PyTreeRestore(restore_args=args))
