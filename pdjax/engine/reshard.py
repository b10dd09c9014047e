"""Weights resharded from the device copies already there (a re-mesh: pdjax/engine/remesh.py):
each device of the new mesh takes its new shard from an old instance's shard on the same
device when that shard holds it (a slice on the device: two TP1 copies become a TP2 instance
without a byte between devices), and from the first old copy otherwise (`jax.device_put` of
that slice: a TP2 instance split into two TP1 copies gathers the other half). No host copy."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pdjax.models import param_layout as param_layout_lib


def stacked_params(inst):
  """An instance's parameters as the stacked tree, on its own devices."""
  return param_layout_lib.to_stacked(inst.params, inst.cfg.num_layers, inst.param_layout,
                                     stack=jnp.stack)


def _bounds(index: tuple, shape: tuple) -> list[tuple[int, int]]:
  out = []
  for dim, s in enumerate(shape):
    sl = index[dim] if dim < len(index) else slice(None)
    out.append((sl.start or 0, s if sl.stop is None else sl.stop))
  return out


def _local_piece(leaves, device, index, shape):
  """The part `index` of the array, cut from a shard already on `device` (a copy: the old
  instance's arrays are freed after), or None."""
  need = _bounds(index, shape)
  for leaf in leaves:
    for shard in leaf.addressable_shards:
      if shard.device != device:
        continue
      have = _bounds(shard.index, shape)
      if all(h0 <= n0 and n1 <= h1 for (n0, n1), (h0, h1) in zip(need, have)):
        if need == have:
          return shard.data.copy()     # (a whole slice would be the shard itself)
        return shard.data[tuple(slice(n0 - h0, n1 - h0) for (n0, n1), (h0, _) in
                                zip(need, have))]
  return None


def put_local_first(sharding, leaves):
  """One array on `sharding` from copies of it (`leaves`, on the old devices)."""
  shape = leaves[0].shape
  pieces = []
  for device, index in sharding.addressable_devices_indices_map(shape).items():
    piece = _local_piece(leaves, device, index, shape)
    if piece is None:
      piece = jax.device_put(leaves[0][index], device, may_alias=False)
    pieces.append(piece)
  return jax.make_array_from_single_device_arrays(shape, sharding, pieces)


class DeviceSource:
  """A parameter restorer (engine/instance.place_params) reading the old instances' device
  arrays (`sources`: their stacked trees) instead of a checkpoint."""

  def __init__(self, sources: list):
    self.sources = sources
    self.abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                                           sources[0])

  def __call__(self, shardings):
    return jax.tree_util.tree_map(lambda sh, *leaves: put_local_first(sh, leaves), shardings,
                                  *self.sources)


def free_stacked_copies(sources: list, instances: list) -> None:
  """Deletes what `stacked_params` made (the stacked layers of unrolled weights), not the
  instances' own arrays."""
  own = {id(x) for inst in instances for x in jax.tree_util.tree_leaves(inst.params)}
  for src in sources:
    for leaf in jax.tree_util.tree_leaves(src):
      if id(leaf) not in own:
        leaf.delete()
