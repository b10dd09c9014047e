"""The simulator's layer-group KV streaming (kv.stream_layers = G): when a prefill step streams
a prompt's KV, group g's share of it (its layers' fraction of the bytes) leaves once the step
has computed through group g's layers, and the link carries the groups one after another:

  ready_g = start + step_s * (layers through group g) / layers
  land_g  = max(land_{g-1}, ready_g) + transfer_s(bytes * layers_g / layers) + group_s

(land_{-1} = start). The transfer lands at land_{G-1}; what is left after the prefill ends,
land_{G-1} - (start + step_s), is the exposed part (Request.transfer_exposed_s). group_s: the
cost model's `stream_group_s` (host time per group dispatch; 0 for the roofline's ideal
engine), also added to the step once per group after the first. Pure Python.
"""

from __future__ import annotations

from pdjax.kv.layer_groups import group_bounds
from pdjax.sim.transfer import SimTransfer


def group_fractions(num_layers: int, groups: int) -> list[float]:
  """Each layer group's share of the layers (equal shares when num_layers is unknown, 0)."""
  if not num_layers:
    return [1.0 / groups] * groups
  return [(b - a) / num_layers for a, b in group_bounds(num_layers, groups)]


def streamed_transfers(src, step_s: float, streams, num_layers: int) -> list[SimTransfer]:
  """The transfers of a prefill step of step_s seconds dispatched now on src, one per stream
  (dst SimInstance, source pages, destination pages)."""
  cost, start = src.cost, src.clock.now()
  fractions = group_fractions(num_layers, src.opts.stream_layers)
  group_s = getattr(cost, "stream_group_s", 0.0)
  out = []
  for dst, src_pages, dst_pages in streams:
    if len(src_pages) != len(dst_pages):
      raise ValueError(f"page counts differ: {len(src_pages)} source, {len(dst_pages)} "
                       f"destination")
    num_bytes = src.kv_bytes(cost.moved_pages(len(src_pages)))
    land, done, ends = start, 0.0, []
    for share in fractions:
      done += share
      land = max(land, start + step_s * done) + cost.transfer_s(num_bytes * share) + group_s
      ends.append(land - start)
    first = start + step_s * fractions[0]
    transfer = SimTransfer(src, list(src_pages), dst, list(dst_pages), num_bytes, land - first)
    transfer.end_s, transfer.group_ends_s = land, tuple(ends)
    out.append(transfer)
  return out
