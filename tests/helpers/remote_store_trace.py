"""The cross-node store tests' hand-built trace (tests/kv/test_remote_store.py and
tests/distributed/test_ray_nodes.py): two colocated instances of 8 pages of 16 tokens, one
per node, taken in turn (round robin). r0 (node 0) computes X, 64 tokens (its first 3 pages
are named: one token is always left to compute); r1 fills node 1; r2, 112 tokens on node 0,
evicts X's pages into node 0's tier; r3, X plus 16 tokens, lands on node 1, whose tier has
none of X: its 3 pages are in node 0's."""

import random

from helpers.host_tier_trace import X


def remote_rows(last_tenant: str = "a") -> list[dict]:
  rng = random.Random(1)
  fill = lambda: [rng.randrange(3, 500) for _ in range(112)]   # noqa: E731
  return [{"arrival_s": 0.0, "prompt_ids": X, "output_len": 1, "tenant": "a"},
          {"arrival_s": 1.0, "prompt_ids": fill(), "output_len": 1, "tenant": "a"},
          {"arrival_s": 2.0, "prompt_ids": fill(), "output_len": 1, "tenant": "a"},
          {"arrival_s": 3.0, "prompt_ids": X + [7] * 16, "output_len": 4,
           "tenant": last_tenant}]


def remote_overrides(path, **more) -> dict:
  """The config of the trace at `path`: two nodes, each its own host tier, the store of the
  other node readable (kv.remote_store)."""
  return {"mode": "colocated", "workload.kind": "jsonl", "workload.path": str(path),
          "workload.num_requests": 4, "cluster.colocated.instances": 2, "cluster.nodes": 2,
          "kv.page_size": 16, "kv.max_model_len": 128, "kv.pages_per_instance": 8,
          "kv.prefix_cache": True, "kv.host_tier_pages": 64, "kv.remote_store": True,
          "scheduler.prefill_router": "round_robin", "scheduler.decode_router": "round_robin",
          **more}
