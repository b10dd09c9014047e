"""The KV layer on its own (summary.json `kv_layer`, report.md "KV layer"): what the article
behind pdjax asks a KV service to show: hot prefixes per tenant, pages evicted and expired per
tier, fragmentation, the bytes that moved between tiers and nodes, and the host store's
occupancy over time (plots/kv_store.png). Pure Python; the section is in report_sections.py.

Counts come from the run's audit trail (kv/audit.py: one source for the audit file and these
numbers) and the prefix caches' hit counters. Prefixes show as the first 12 hex digits of
their deepest page's name and a token count, never as token ids.
"""

from __future__ import annotations

import collections

import numpy as np

from pdjax.metrics import columns
from pdjax.metrics.kv_cache import prefix_hits

TOP_PER_TENANT = 10
PREFIX_HEX = 12


def kv_layer_summary(audit_lines, caches, fragmentation: float,
                     cross_node_transfer_bytes: int = 0) -> dict:
  """audit_lines: RunResult.kv_audit; caches: the instances' PrefixCaches;
  cross_node_transfer_bytes: P -> D bytes between nodes (`cross_node_transfer_bytes`)."""
  pages = collections.Counter()
  bytes_ = collections.Counter()
  for line in audit_lines:
    pages[line["event"], line["tier"]] += line["pages"]
    bytes_[line["event"]] += line["bytes"]
    bytes_[line["event"], line["tier"]] += line["bytes"]
  return {
      "hot_prefixes_by_tenant": hot_prefixes_by_tenant(caches),
      "evicted_pages": {"device": pages["evict", "device"], "host": pages["evict", "host"]},
      "expired_pages": {"device": pages["expire", "device"], "host": pages["expire", "host"]},
      "flushed_pages": {"device": pages["flush", "device"], "host": pages["flush", "host"]},
      "internal_fragmentation": fragmentation,
      "offloaded_bytes": bytes_["offload"], "reloaded_bytes": bytes_["reload"],
      # between nodes (cluster.nodes > 1): reloads from another node's tier, P -> D transfers
      "cross_node_bytes": bytes_["reload", "remote"] + cross_node_transfer_bytes,
      "cross_node_reload_bytes": bytes_["reload", "remote"],
      "cross_node_transfer_bytes": cross_node_transfer_bytes,
      "audit_lines": len(audit_lines),
  }


def hot_prefixes_by_tenant(caches, top: int = TOP_PER_TENANT) -> dict[str, list[dict]]:
  """Each tenant's (salt's) most-hit prefixes, hits summed over instances: {salt: [{"prefix",
  "tokens", "hits"}]}, most hits first (ties: the longer prefix, then the name)."""
  hits, depth = prefix_hits(caches)
  page_size = caches[0].page_size if caches else 0
  by_salt: dict[str, list] = collections.defaultdict(list)
  for (salt, name), n in hits.items():
    by_salt[salt].append((name, n))
  out = {}
  for salt in sorted(by_salt):
    ranked = sorted(by_salt[salt], key=lambda x: (-x[1], -depth[(salt, x[0])], x[0]))[:top]
    out[salt] = [{"prefix": name.hex()[:PREFIX_HEX], "tokens": depth[(salt, name)] * page_size,
                  "hits": n} for name, n in ranked]
  return out


def host_tier_pages(samples, node_of: dict | None = None) -> dict:
  """{node: (t, pages held)} of the samples that carry their node's host tier's page count
  (with kv.host_tier_pages on): every instance of a node samples the same tier. node_of:
  {instance: node} (cluster.nodes > 1: runner/outputs.py's `node_of_instances`); None: one
  node, 0. Empty when no sample carries it."""
  has = columns.present(samples, "host_tier_pages")
  if not has.any():
    return {}
  t, pages = columns.numbers(samples, ("t", "host_tier_pages"), {"host_tier_pages": -1.0})
  if not node_of:
    return {0: (t[has], pages[has])}
  code, names = columns.codes(samples, "instance")
  node = np.array([node_of.get(n, -1) for n in names], np.int64)[code]
  return {k: (t[has & (node == k)], pages[has & (node == k)])
          for k in sorted(set(node_of.values())) if (has & (node == k)).any()}


def cross_node_transfer_bytes(requests, instances) -> int:
  """The bytes of the P -> D transfers whose two instances sit on different nodes."""
  node = {i.name: getattr(i, "node", 0) for i in instances}
  return sum(r.transfer_bytes for r in requests
             if r.prefill_instance in node and r.decode_instance in node
             and node[r.prefill_instance] != node[r.decode_instance])
