"""Re-meshing with the Ray launcher (scheduler/remesh.py drives it): the actors owning a tier's
devices are replaced by new actors at the new TP.

A new actor is a new process: it loads the weights itself (`model.checkpoint`, or the seeded
initialisation every actor of the run shares) and compiles its programs (from the persistent
compile cache when `compile_cache_dir` is set), so the whole start is the switch's compile
phase and nothing is resharded (`reshard_s` 0): the device copies of the old actors live in
other processes. KV moves from the old actors to the new ones actor to actor, through the
run's RayTransfer: the launcher built every actor of a re-meshed tier able to send and receive
at each allowed TP (`RayCluster.build_instances(remesh_tps=...)`). Then the new actors' transfer
connections are warmed, and `release` kills the old ones. A failed start (the process died,
a device error) raises DeviceError after the new actors are killed: the old ones keep serving.
On the CPU backend every actor has its own virtual devices, so old and new coexist while KV
moves; with GPUs or TPUs the new actors need free chips to start on beside the old ones."""

from __future__ import annotations

import dataclasses
import time

from pdjax.distributed.remote import RemoteInstance
from pdjax.errors import DeviceError


class RayRemeshBuilder:

  def __init__(self, cluster, instances: list, prepare=None):
    """prepare: what every instance of the run gets once built (runner/build.py `_preparer`:
    the prefix cache, the node's host tier, the latency profile's cost): a new actor gets it
    too, as the engine's re-mesh does, with its tier's node, seal key and cross-node link."""
    self.cluster, self.live, self.prepare = cluster, list(instances), prepare
    self.cost_of = None     # (no latency model of the layouts: the load-driven policy's
    self.switch_s = 0.0     #   queue-signal rules decide; a schedule is exact)

  def build(self, old: list, role: str, count: int, tp: int, names: list[str]):
    """(new instances, {"reshard_s", "compile_s"}); DeviceError leaves `old` serving."""
    proto = old[0]
    pages = sum(i.opts.num_pages for i in old)
    new = []
    for name in names:
      spec = dataclasses.replace(proto.spec, name=name, tp=tp,
                                 opts=dataclasses.replace(proto.opts, num_pages=pages // count))
      new.append(RemoteInstance(spec, self.cluster._new_actor, proto._warm_up_args))
      new[-1].store_of = self.cluster.node_store
      for attr in ("node", "seal_key", "node_link"):   # (set on the first ones by the run)
        if hasattr(proto, attr):
          setattr(new[-1], attr, getattr(proto, attr))
    t0 = time.perf_counter()
    try:
      refs = [inst.start() for inst in new]
      for inst, r in zip(new, refs):
        inst.finish_start(r)
      self.cluster._live += new
      self.cluster._warm_up_transfers(self.live + new, involving=new)
    except DeviceError:
      self.cluster.release(new)
      raise
    for inst in new:
      if self.prepare is not None:
        self.prepare(inst)
    self.live = [i for i in self.live if i not in old] + new
    return new, {"reshard_s": 0.0, "compile_s": time.perf_counter() - t0}

  def release(self, old: list) -> None:
    """The replaced actors' processes end."""
    self.cluster.release(old)
