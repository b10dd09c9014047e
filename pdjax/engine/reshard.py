"""Weights resharded from the device copies already there (a re-mesh: pdjax/engine/remesh.py),
with no host copy and no full intermediate copy:

  a stacked target (TP > 1, or any TPU/GPU instance): each device of the new mesh cuts its new
      shard out of what an old instance holds on that same device (a TP1 copy's layers, sliced
      and stacked there; a sharded copy's shard, sliced) — merging TP1 copies moves no byte
      between devices — and only a piece no local copy holds comes from another device;
  an unrolled target (a CPU TP1 instance, param_layout.py): each layer's arrays are the
      old instance's own on that device when it holds them whole, else that layer gathered
      from the sharded copy (one layer at a time, never the whole stack at once).
Every piece is a new array: the old instances are freed after."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pdjax.models import param_layout as param_layout_lib


def _get(tree, keys):
  for k in keys:
    tree = tree[k]
  return tree


def _bounds(index: tuple, shape: tuple) -> list[tuple[int, int]]:
  out = []
  for dim, s in enumerate(shape):
    sl = index[dim] if dim < len(index) else slice(None)
    out.append((sl.start or 0, s if sl.stop is None else sl.stop))
  return out


def _cut(array, need, have):
  """need (bounds) out of a single-device array holding `have`; a copy."""
  if need == have:
    return array.copy()       # (a whole slice would be the array itself)
  return array[tuple(slice(n0 - h0, n1 - h0) for (n0, n1), (h0, _) in zip(need, have))]


@functools.partial(jax.jit, static_argnums=1)
def _cut_and_stack(arrays, bounds):
  """One program: each layer's array cut to `bounds`, stacked (a new array)."""
  return jnp.stack([a[tuple(slice(b0, b1) for b0, b1 in bounds)] for a in arrays])


@jax.jit
def _unstack(stacked):
  """One program: a stacked leaf's layers as separate (new) arrays."""
  return [stacked[layer] for layer in range(stacked.shape[0])]


class DeviceSource:
  """The parameters of new instances, read from old instances' device arrays (`old`: engine
  Instances, any layout and TP). `abstract`: the stacked tree's shapes and dtypes."""

  def __init__(self, old: list):
    self.old = old
    first = old[0]
    stacked = param_layout_lib.to_stacked(
        jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), first.params),
        first.cfg.num_layers, first.param_layout, stack=_abstract_stack)
    self.abstract = stacked
    self.num_layers = first.cfg.num_layers

  def _layer_arrays(self, inst, keys):
    """The per-layer arrays of the stacked leaf `keys` (["params", "layers", ...]) in an
    unrolled instance."""
    rest = keys[2:]
    return [_get(inst.params["params"][f"layers_{layer}"], rest)
            for layer in range(self.num_layers)]

  def _local(self, inst, keys, device, index, shape):
    """The piece `index` of stacked leaf `keys` cut on `device` from inst's arrays there, or
    None when inst does not hold it there."""
    need = _bounds(index, shape)
    if inst.param_layout == "unrolled" and keys[1] == "layers":
      arrays = self._layer_arrays(inst, keys)
      if arrays[0].devices() != {device} or need[0] != (0, shape[0]):
        return None
      return _cut_and_stack(arrays, tuple(need[1:]))
    leaf = _get(inst.params, keys)
    for shard in leaf.addressable_shards:
      if shard.device == device:
        have = _bounds(shard.index, shape)
        if all(h0 <= n0 and n1 <= h1 for (n0, n1), (h0, h1) in zip(need, have)):
          return _cut(shard.data, need, have)
    return None

  def _remote(self, keys, device, index):
    """The piece from the first old instance, wherever it lies, sent to `device`."""
    inst = self.old[0]
    if inst.param_layout == "unrolled" and keys[1] == "layers":
      whole = jnp.stack(self._layer_arrays(inst, keys))
      return jax.device_put(whole[index], device, may_alias=False)
    return jax.device_put(_get(inst.params, keys)[index], device, may_alias=False)

  def put(self, keys, sharding):
    shape = _get(self.abstract, keys).shape
    pieces = []
    for device, index in sharding.addressable_devices_indices_map(shape).items():
      piece = next((p for p in (self._local(i, keys, device, index, shape) for i in self.old)
                    if p is not None), None)
      pieces.append(self._remote(keys, device, index) if piece is None else piece)
    return jax.make_array_from_single_device_arrays(shape, sharding, pieces)

  def __call__(self, shardings):
    """The stacked tree on `shardings` (engine/instance.place_params' restorer protocol)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, sh: self.put([k.key for k in path], sh), shardings)

  def unrolled(self, device):
    """The unrolled tree on one device (param_layout.py), layer by layer."""
    out = {}
    for name, tree in self.abstract["params"].items():
      if name != "layers":
        keys = ["params", name]
        out[name] = jax.tree_util.tree_map_with_path(
            lambda path, x, keys=keys: self._whole_on(keys + [k.key for k in path], device), tree)
    layers = jax.tree_util.tree_map_with_path(   # leaf -> its per-layer arrays
        lambda path, x: self._layers_on(["params", "layers"] + [k.key for k in path], device),
        self.abstract["params"]["layers"])
    for layer in range(self.num_layers):
      out[f"layers_{layer}"] = jax.tree_util.tree_map(lambda per: per[layer], layers,
                                                      is_leaf=lambda x: isinstance(x, list))
    return {"params": out}

  def _layers_on(self, keys, device) -> list:
    """Stacked leaf `keys`'s per-layer arrays, new, on `device`: an old unrolled instance's
    own there (copied), else the leaf gathered there whole once and split by one program."""
    for inst in self.old:
      if inst.param_layout == "unrolled":
        arrays = self._layer_arrays(inst, keys)
        if arrays[0].devices() == {device}:
          return [a.copy() for a in arrays]
    inst = self.old[0]
    if inst.param_layout == "unrolled":
      return [jax.device_put(a, device, may_alias=False) for a in self._layer_arrays(inst, keys)]
    return _unstack(jax.device_put(_get(inst.params, keys), device, may_alias=False))

  def _whole_on(self, keys, device):
    """Non-layer leaf `keys` whole on `device`: an old instance's own copy there, else sent
    from the first old instance."""
    for inst in self.old:
      arr = _get(inst.params, keys)
      for shard in arr.addressable_shards:
        if shard.device == device and shard.data.shape == arr.shape:
          return shard.data.copy()   # (device_put would hand back this very buffer)
    return jax.device_put(_get(self.old[0].params, keys), device)


def _abstract_stack(items):
  return jax.ShapeDtypeStruct((len(items),) + tuple(items[0].shape), items[0].dtype)
