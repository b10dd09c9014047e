"""kv.stream_layers' layer groups: which layers each streamed piece of a prompt's KV holds. Pure
Python: the engine streams by them, the simulator charges by them, the Ray transfer splits by
them."""

from __future__ import annotations


def group_bounds(num_layers: int, groups: int) -> tuple[tuple[int, int], ...]:
  """kv.stream_layers' layer groups: G consecutive ranges covering [0, num_layers), sizes
  differing by at most one, the larger first (the last group's transfer is the one left
  exposed after the prefill: keep it the smallest)."""
  if not 1 <= groups <= num_layers:
    raise ValueError(f"layer groups must be in [1, {num_layers}] (the model's layers), "
                     f"got {groups}")
  base, extra = divmod(num_layers, groups)
  out, at = [], 0
  for g in range(groups):
    size = base + (g < extra)
    out.append((at, at + size))
    at += size
  return tuple(out)
