"""The serving process's own footprint after a run: resident memory and memory maps.

A command that serves many runs in one process (repeats, mode=compare, sweeps) must not grow
with each: what a run compiled and allocated is reused by the next run or released
(runner/instance_pool.py). Each run's summary.json records this after the run (`process`), so
growth shows in the outputs, and the kernel's limit on maps (vm.max_map_count, 65,530 by
default) is visible before a command reaches it. Linux only (/proc); None elsewhere.
"""

from __future__ import annotations


def process_footprint() -> dict | None:
  """{"rss_bytes", "memory_maps", "max_map_count"} of this process now; None without /proc."""
  try:
    with open("/proc/self/status") as f:
      rss_kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    with open("/proc/self/maps") as f:
      maps = sum(1 for _ in f)
  except (OSError, StopIteration):
    return None
  try:
    with open("/proc/sys/vm/max_map_count") as f:
      limit = int(f.read())
  except (OSError, ValueError):
    limit = None
  return {"rss_bytes": rss_kb * 1024, "memory_maps": maps, "max_map_count": limit}
