"""What sealing KV costs on this machine (issue 32, `kv.seal_cross_node`): AES-GCM sealing and
opening of KV pages in host memory (pdjax/kv/seal.py), against a plain copy of the same bytes
(what the host path does anyway), in GB/s of page bytes.

  python benchmarks/kv_seal.py [--page-kib=2048] [--pages=64] [--reps=5]

Prints the machine, the page size and, per operation, the median of reps (one thread; the
cryptography package's OpenSSL AES-GCM, AES-NI where the CPU has it).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np

from pdjax.kv.seal import PageSealer, new_run_key


def page_args(description: str) -> argparse.Namespace:
  """--page-kib, --pages, --reps (shared with kv_store_ray.py)."""
  p = argparse.ArgumentParser(description=description)
  p.add_argument("--page-kib", type=int, default=2048)
  p.add_argument("--pages", type=int, default=64)
  p.add_argument("--reps", type=int, default=5)
  return p.parse_args()


def main() -> None:
  a = page_args(__doc__.split("\n")[0])
  rng = np.random.default_rng(0)
  pages = [rng.integers(0, 255, a.page_kib * 1024, dtype=np.uint8) for _ in range(a.pages)]
  names = [i.to_bytes(16, "little") for i in range(a.pages)]
  total = sum(x.nbytes for x in pages)
  sealer = PageSealer(new_run_key())
  times = {"copy": [], "seal": [], "open": []}
  for _ in range(a.reps):
    t = time.perf_counter()
    copies = [x.copy() for x in pages]
    times["copy"].append(time.perf_counter() - t)
    t = time.perf_counter()
    sealed = [sealer.seal(n, x) for n, x in zip(names, pages)]
    times["seal"].append(time.perf_counter() - t)
    t = time.perf_counter()
    opened = [sealer.open(n, s) for n, s in zip(names, sealed)]
    times["open"].append(time.perf_counter() - t)
    assert all(np.array_equal(o, x) for o, x in zip(opened, copies))
  print(f"machine: {platform.machine()} {platform.processor() or ''}, {os.cpu_count()} cores; "
        f"{a.pages} pages of {a.page_kib} KiB ({total / 2**20:.0f} MiB), one thread, median of "
        f"{a.reps}")
  for op, ts in times.items():
    s = statistics.median(ts)
    print(f"  {op:5s} {1e3 * s:8.1f} ms  {total / s / 1e9:6.2f} GB/s")


if __name__ == "__main__":
  main()
