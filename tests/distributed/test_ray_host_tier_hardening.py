"""Issue 47 items 1, 3 and 4 under the Ray launcher (the driver-side logic on fakes:
test_remote_host_tier.py). One colocated instance, a pool of 16 pages of 16 tokens, a prefix
cache of at most 8 named pages (kv.cache_pages: naming a finished request's pages offloads the
oldest at once) and a host tier of 8 pages."""

import random
import time

import pytest

from helpers import sim_snapshots
from helpers.checked_run import checked_run
from helpers.host_tier_trace import X, trace_rows, write_trace
from helpers.ray_fixtures import ray_cluster  # noqa: F401  (fixture)


def _rows(spec) -> list[dict]:
  """spec: (arrival, prompt, tokens, output_len, tenant); prompt "X": X then 7s."""
  rng = random.Random(1)
  return [{"arrival_s": t, "output_len": out, "tenant": tenant,
           "prompt_ids": X + [7] * (n - 64) if p == "X" else [rng.randrange(3, 500)
                                                               for _ in range(n)]}
          for t, p, n, out, tenant in spec]


def _config(tmp_path, rows, launcher="ray", **more):
  path = tmp_path / "trace.jsonl"
  write_trace(path, rows)
  return sim_snapshots._config({
      "backend": "jax", "mode": "colocated", "workload.kind": "jsonl",
      "workload.path": str(path), "workload.num_requests": len(rows),
      "cluster.colocated.instances": 1, "cluster.launcher": launcher, "kv.page_size": 16,
      "kv.max_model_len": 128, "kv.pages_per_instance": 16, "kv.prefix_cache": True,
      "kv.cache_pages": 8, "kv.host_tier_pages": 8, **more})


def _store_held_at_end(monkeypatch, ray_cluster):
  """The node store's page count right after the run, before it is cleared for the next."""
  import ray

  from pdjax.distributed.launcher import RayCluster
  held, clear = [], RayCluster.clear_store
  monkeypatch.setattr(RayCluster, "clear_store", lambda self: (held.extend(
      ray.get([self._stores[n].held.remote() for n in sorted(self._stores)])), clear(self)))
  return held


@pytest.mark.slow
def test_a_reload_survives_a_plan_that_offloads_more_than_the_tier_holds(tmp_path, ray_cluster,
                                                                         monkeypatch):
  """Item 1. By 4 s the tier holds X's 4 pages and W's 4, the device Z's 5 and V's 3. At 4 s
  one plan takes r4 (X + 16: X's pages reloaded) and r5 (127 tokens: 8 pages, 5 of them
  evicted, each offered to the full tier). Before: the fifth offer evicted a page r4 had
  taken, the store dropped it, the actor's read raised KeyError and the run stopped. Now
  r4's pages stay until its step has read them; the same tokens as one process."""
  rows = _rows([(0.0, "X", 64, 1, "a"), (1.0, "W", 64, 1, "a"), (2.0, "Z", 80, 1, "a"),
                (3.0, "V", 48, 1, "a"), (4.0, "X", 80, 4, "a"), (4.0, "B", 127, 1, "a")])
  held = _store_held_at_end(monkeypatch, ray_cluster)
  _, local, _ = checked_run(_config(tmp_path, rows, launcher="local"))
  on, r_on, insts = checked_run(_config(tmp_path, rows), ray_cluster=ray_cluster)
  assert [r.output_ids for r in r_on.requests] == [r.output_ids for r in local.requests]
  assert [r.cached_tokens for r in r_on.requests] == [0, 0, 0, 0, 64, 0] == [
      r.cached_tokens for r in local.requests]
  host = on["kv_cache"]["host_tier"]
  # (the store holds the tier's pages but the one offered as r5 finished, to be written
  # before the instance's next step: there is none)
  tier = insts[0].tables.host
  unwritten = sum(tier.in_flight(n, "colocated-0", 0.0) for n in list(tier._pages))
  assert (host["hit_pages"], host["pages_at_end"], held, unwritten, tier.pinned()) == (
      4, 8, [7], 1, 0)


@pytest.mark.slow
def test_a_flush_of_pages_still_being_written_empties_the_store(tmp_path, ray_cluster,
                                                               monkeypatch):
  """Item 4. r2 (Z) finishes at about 2 s: naming its 5 pages offloads X's 4 and W's first,
  offered but not yet written (the write goes with the instance's next step). Tenant a is
  flushed at 2.5 s; r3 (tenant b) at 3 s. Before: the store got the drops, then r3's step
  wrote the 5 pages, kept for good (5 held at the end, the tier holding none). Now none."""
  rows = _rows([(0.0, "X", 64, 1, "a"), (1.0, "W", 64, 1, "a"), (2.0, "Z", 80, 1, "a"),
                (3.0, "V", 48, 1, "b")])
  held = _store_held_at_end(monkeypatch, ray_cluster)
  cfg = _config(tmp_path, rows)
  cfg.kv.flush_tenants = "a@2.5"
  on, r_on, _ = checked_run(cfg, ray_cluster=ray_cluster)
  host = on["kv_cache"]["host_tier"]
  assert (host["offloaded_pages"], host["flushed_pages"], host["pages_at_end"]) == (5, 5, 0)
  assert held == [0]
  assert [(line["tier"], line["pages"]) for line in r_on.kv_audit
          if line["event"] == "flush"] == [("device", 8), ("host", 5)]


class _Sleep:
  """Unpickled as time.sleep(seconds): a call that carries it holds the store that long."""

  def __init__(self, seconds: float):
    self.seconds = seconds

  def __reduce__(self):
    return time.sleep, (self.seconds,)


@pytest.mark.slow
def test_a_store_that_does_not_answer_loses_the_tier_not_the_run(tmp_path, ray_cluster,
                                                                monkeypatch):
  """Item 3. The store is held for 10 s just as the first evicted pages are written (the
  driver waits at most 2 s here): the tier is lost, the run goes on and r4 recomputes X,
  with the tokens of a run without the tier."""
  import pdjax.distributed.remote as remote_mod
  from pdjax.distributed.remote import RemoteInstance
  monkeypatch.setattr(remote_mod, "STORE_TIMEOUT_S", 2.0)
  flush, wedged = RemoteInstance.flush_offloads, []

  def wedge_then_flush(self):
    if self._offloads and not wedged:
      wedged.append(self.store.drop.remote([_Sleep(10.0)]))
    return flush(self)

  monkeypatch.setattr(RemoteInstance, "flush_offloads", wedge_then_flush)
  path = tmp_path / "trace.jsonl"
  write_trace(path, trace_rows())
  base = {"backend": "jax", "mode": "colocated", "workload.kind": "jsonl",
          "workload.path": str(path), "workload.num_requests": 5,
          "cluster.colocated.instances": 1, "kv.page_size": 16, "kv.max_model_len": 128,
          "kv.pages_per_instance": 16, "kv.prefix_cache": True}
  _, off, _ = checked_run(sim_snapshots._config({**base, "cluster.launcher": "local"}))
  start = time.perf_counter()
  on, r_on, insts = checked_run(sim_snapshots._config({
      **base, "cluster.launcher": "ray", "kv.host_tier_pages": 64}), ray_cluster=ray_cluster)
  assert len(wedged) == 1 and time.perf_counter() - start < 120
  assert [r.output_ids for r in r_on.requests] == [r.output_ids for r in off.requests]
  assert r_on.requests[-1].cached_tokens == 0 and insts[0].tables.host.lost
  assert on["kv_cache"]["host_tier"]["hit_pages"] == 0
