"""How a node's KV store should hold pages under the Ray launcher (issue 32): in Ray's object
store (plasma shared memory: the writer returns the pages from an actor call, one object each,
owned by the driver that made the call, as `ray.put(_owner=...)` was removed in Ray 2.56; the
reader `ray.get`s them), inside a store actor (pages sent to it and fetched from it by actor
calls), or in a store actor that puts each page into the object store itself and hands out
the refs (the reader then fetches objects the store owns). Two actors stand for an offloading
and a reloading instance on one node.

  python benchmarks/kv_store_ray.py [--page-kib=2048] [--pages=64] [--reps=5]

Prints, per way, the median over reps of writing `pages` pages (writer: put them, the driver
receiving the handles) and of reading them back (reader: fetch them as numpy arrays), in ms
and GB/s, with the machine's description. Page sizes: Llama-3-8B's bf16 page of 16 tokens is
2 MiB; the tiny test model's is 16 KiB.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time

import numpy as np


def main() -> None:
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from kv_seal import page_args
  a = page_args(__doc__.split("\n")[0])
  os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
  import ray
  ray.init(include_dashboard=False, logging_level="ERROR")

  @ray.remote
  class Store:
    def __init__(self):
      self.pages = {}

    def put(self, items):
      self.pages.update(items)
      return len(items)

    def get(self, names):
      return [self.pages[n] for n in names]

    def ping(self):
      return True

  @ray.remote
  class RefStore:
    """A store actor that puts each page into the object store itself (it owns them) and
    hands out the refs: readers then fetch the objects as the object-store way does."""
    def __init__(self):
      self.refs = {}

    def put(self, items):
      self.refs.update({n: ray.put(a) for n, a in items.items()})
      return len(items)

    def get(self, names):
      return [self.refs[n] for n in names]

    def ping(self):
      return True

  @ray.remote
  class Instance:
    def __init__(self, page_bytes, pages):
      rng = np.random.default_rng(0)
      self.data = [rng.integers(0, 255, page_bytes, dtype=np.uint8) for _ in range(pages)]

    def put_objects(self):
      return tuple(self.data) if len(self.data) > 1 else self.data[0]

    def get_objects(self, refs):
      return sum(int(x.nbytes) for x in ray.get(list(refs)))

    def put_actor(self, store):
      return ray.get(store.put.remote({i: d for i, d in enumerate(self.data)}))

    def get_actor(self, store, names):
      return sum(int(x.nbytes) for x in ray.get(store.get.remote(names)))

    def get_refs(self, store, names):
      return sum(int(x.nbytes) for x in ray.get(ray.get(store.get.remote(names))))

  page_bytes = a.page_kib * 1024
  store, ref_store = Store.remote(), RefStore.remote()
  writer, reader = Instance.remote(page_bytes, a.pages), Instance.remote(page_bytes, a.pages)
  ray.get([store.ping.remote(), ref_store.ping.remote(), writer.get_objects.remote([]),
           reader.get_objects.remote([])])
  total = page_bytes * a.pages
  results = {}
  for way in ("object store", "store actor", "store actor, its objects"):
    w, r = [], []
    for _ in range(a.reps):
      t = time.perf_counter()
      if way == "object store":
        refs = writer.put_objects.options(num_returns=a.pages).remote()
        refs = refs if isinstance(refs, list) else [refs]
        ray.wait(refs, num_returns=len(refs), fetch_local=False)
      else:
        ray.get(writer.put_actor.remote(store if way == "store actor" else ref_store))
      w.append(time.perf_counter() - t)
      t = time.perf_counter()
      names = list(range(a.pages))
      got = ray.get(reader.get_objects.remote(refs) if way == "object store"
                    else reader.get_actor.remote(store, names) if way == "store actor"
                    else reader.get_refs.remote(ref_store, names))
      r.append(time.perf_counter() - t)
      assert got == total
    results[way] = (statistics.median(w), statistics.median(r))
  print(f"machine: {platform.machine()}, {os.cpu_count()} cores, ray {ray.__version__}; one "
        f"node, {a.pages} pages of {a.page_kib} KiB ({total / 2**20:.0f} MiB), median of "
        f"{a.reps}")
  for way, (w, r) in results.items():
    print(f"  {way:24s}  write {1e3 * w:8.2f} ms ({total / w / 1e9:5.2f} GB/s)   read "
          f"{1e3 * r:8.2f} ms ({total / r / 1e9:5.2f} GB/s)")
  ray.shutdown()


if __name__ == "__main__":
  main()
