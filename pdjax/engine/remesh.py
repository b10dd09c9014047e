"""The real engine's re-mesh builder (scheduler/remesh.py drives it): the new instances of a
tier on the old instances' devices, weights resharded from the device copies already there
(engine/reshard.py), programs compiled ahead.

Standby instances: at start-up, `precompile` builds each instance a layout of the schedule (or,
deciding from the load, any allowed layout) would need, compiles its programs, and unloads its
weights and KV pool (Instance.unload): the programs stay. A re-mesh then only reshards weights
into a standby instance (Instance.load) — no compile in the switch — and a replaced instance
becomes a standby one, so switching back costs the same. A layout not precompiled is built and
compiled in the switch (its compile phase). Every instance's KV transfer programs cover every
TP its KV may go to: the decode tier's (prefill instances), its own tier's (migrations).
Holding standby programs costs host memory, not device memory."""

from __future__ import annotations

import dataclasses
import time

import jax

from pdjax.engine import mesh as mesh_lib
from pdjax.engine import reshard as reshard_lib
from pdjax.engine.instance import Instance, place_params
from pdjax.engine.runtime import device_errors


def _key(role: str, devices) -> tuple:
  return role, tuple(d.id for d in devices)


class EngineRemeshBuilder:

  def __init__(self, mcfg, opts_by_role: dict, instances: list, prepare=None):
    """instances: the run's (the builder tracks which serve); prepare(inst): what the runner
    does to a new instance (prefix cache, host tier, latency profile)."""
    self.mcfg, self.opts_by_role = mcfg, opts_by_role
    self.live = list(instances)
    self.prepare = prepare or (lambda inst: None)
    self.standby: dict[tuple, Instance] = {}
    self.tps = {role: {i.tp for i in instances if i.role == role} for role in ("prefill",
                                                                              "decode")}
    self.cost_of = None     # (role, tp) -> step costs, when a latency profile gives them
    self.switch_s = 0.0     # the longest rehearsed reshard (what a switch is expected to take)

  def _devices(self, role: str) -> list:
    return [d for i in self.live if i.role == role for d in i.mesh.devices.flat]

  def _warm(self, inst: Instance) -> None:
    """Compiles what inst lacks of its KV transfer programs (see the module's docstring)."""
    tps = self.tps["decode"] | self.tps[inst.role]
    missing = tuple(sorted(tp for tp in tps
                           if any((n, tp) not in inst._gather for n in inst.opts.transfer_buckets)))
    inst.warm_up(prefill=False, decode=False, transfer_to_tp=missing, receive=not inst._scatter)

  def precompile(self, layouts: dict[str, list[tuple[int, int]]], host_params,
                 progress=None) -> int:
    """A standby instance for each instance of these layouts ({role: [(count, tp)]}) on the
    tier's devices that is not serving there already; returns how many were built."""
    for role, lays in layouts.items():
      self.tps[role] |= {tp for _, tp in lays}
    todo = {}
    for role, lays in layouts.items():
      devices = self._devices(role)
      pages = sum(i.opts.num_pages for i in self.live if i.role == role)
      serving = {_key(role, i.mesh.devices.flat) for i in self.live}
      for count, tp in lays:
        for k in range(count):
          devs = tuple(devices[k * tp:(k + 1) * tp])
          if _key(role, devs) not in serving and _key(role, devs) not in self.standby:
            todo.setdefault(_key(role, devs), (
                mesh_lib.InstanceSpec(f"{role}-standby-{count}x{tp}-{k}", role, devs),
                dataclasses.replace(self.opts_by_role[role], num_pages=pages // count)))
    for n, (key, (spec, opts)) in enumerate(todo.items()):
      inst = Instance(spec, self.mcfg, host_params, opts)
      inst.warm_up(prefill=True, decode=True)
      self._warm(inst)
      self._rehearse(inst)
      inst.unload()
      self.standby[key] = inst
      if progress is not None:
        progress(n + 1, len(todo), f"standby instance {spec.name}")
    for inst in self.live:
      self._warm(inst)
    return len(todo)

  def _rehearse(self, standby: Instance) -> None:
    """Reshards once each way between `standby` and the serving instances on its devices, the
    results dropped: the small programs a reshard runs (engine/reshard.py) are compiled now,
    not in the switch."""
    devices = set(standby.mesh.devices.flat)
    peers = [i for i in self.live
             if i.role == standby.role and devices & set(i.mesh.devices.flat)]
    if not peers:
      return
    t0 = time.perf_counter()
    standby.load(reshard_lib.DeviceSource(peers))
    jax.block_until_ready(standby.params)
    self.switch_s = max(self.switch_s, time.perf_counter() - t0)
    for peer in peers:
      _, params = place_params(peer.mesh, reshard_lib.DeviceSource([standby]),
                               peer.cfg.num_layers, peer.param_layout)
      jax.block_until_ready(params)
      for leaf in jax.tree_util.tree_leaves(params):
        leaf.delete()

  def build(self, old: list, role: str, count: int, tp: int, names: list[str]):
    """(new instances, {"reshard_s", "compile_s"}); DeviceError leaves `old` untouched."""
    devices = [d for i in old for d in i.mesh.devices.flat]
    pages = sum(i.opts.num_pages for i in old)
    self.tps[role].add(tp)
    new, compile_s = [], 0.0
    source, reshard_s = reshard_lib.DeviceSource(old), 0.0
    try:
      with device_errors():
        for k, name in enumerate(names):
          devs = tuple(devices[k * tp:(k + 1) * tp])
          t0 = time.perf_counter()
          inst = self.standby.pop(_key(role, devs), None)
          if inst is not None:
            inst.name = name
            new.append(inst)
            inst.load(source)
            jax.block_until_ready(inst.params)
            reshard_s += time.perf_counter() - t0
            continue
          opts = dataclasses.replace(self.opts_by_role[role], num_pages=pages // count)
          inst = Instance(mesh_lib.InstanceSpec(name, role, devs), self.mcfg,
                          source, opts)
          new.append(inst)
          jax.block_until_ready(inst.params)
          t1 = time.perf_counter()
          reshard_s += t1 - t0
          inst.warm_up(prefill=True, decode=True)
          compile_s += time.perf_counter() - t1
        t0 = time.perf_counter()
        for inst in new + self.live:   # transfers to the new TP (the old instances' too:
          self._warm(inst)             # they send their requests' KV to the new ones)
        compile_s += time.perf_counter() - t0
    except BaseException:
      for inst in new:
        if inst.params is not None:
          inst.unload()
        self.standby[_key(role, inst.mesh.devices.flat)] = inst
      raise
    for inst in new:
      self.prepare(inst)
    self.live = [i for i in self.live if i not in old] + new
    return new, {"reshard_s": reshard_s, "compile_s": compile_s}

  def release(self, old: list) -> None:
    """The replaced instances free their weights and pools and stand by."""
    for inst in old:
      inst.unload()
      self.standby[_key(inst.role, inst.mesh.devices.flat)] = inst
