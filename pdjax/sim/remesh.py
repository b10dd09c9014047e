"""The simulator's re-mesh builder (scheduler/remesh.py): new SimInstances at the new TP on
the old instances' devices, with the switch's phases modelled:

  reshard  each device receives the part of its new weight shard it does not hold already,
           max(0, W / tp_new - W / tp_old) bytes (W: the model's weight bytes; a merge from
           full TP1 copies needs none, a split from TP2 needs half the model per device), all
           devices at once over the instances' link: `cost.transfer_s(bytes)`.
  compile  `compile_s`: a calibration profile's measured `remesh_compile_s` (programs loaded
           from the persistent compile cache), else `sim.remesh_compile_s`.
The migration's KV moves with the run's simulated transfer (scheduler/remesh.py times it).
The new pools share the old ones' pages out (KV memory per device is unchanged: a TP2 instance
on two devices holds twice a TP1 instance's pages)."""

from __future__ import annotations


class SimRemeshBuilder:

  def __init__(self, make_instance, weight_bytes: float, compile_s: float, cost_of=None):
    """make_instance(name, role, tp, num_pages) -> a SimInstance ready to serve (the run's
    prefix cache and host tier attached); cost_of(role, tp): the cost model of an instance
    of that TP (the load-driven remesh policy predicts layouts with it)."""
    self.make_instance, self.weight_bytes, self.compile_s = make_instance, weight_bytes, compile_s
    self.cost_of = cost_of
    self.switch_s = compile_s   # what the policy expects a switch to take (reshard aside)

  def reshard_bytes(self, tp_old: int, tp_new: int) -> float:
    """Bytes each device receives (see the module's docstring)."""
    return max(0.0, self.weight_bytes / tp_new - self.weight_bytes / tp_old)

  def build(self, old: list, role: str, count: int, tp: int, names: list[str]):
    pages = sum(o.tables.allocator.num_pages for o in old) // count
    new = [self.make_instance(name, role, tp, pages) for name in names]
    moved = self.reshard_bytes(old[0].tp, tp)
    reshard_s = old[0].cost.transfer_s(moved) if moved else 0.0
    return new, {"reshard_s": reshard_s, "compile_s": self.compile_s}

  def release(self, old: list) -> None:
    """Nothing to free in a simulation."""
