"""kv_audit.jsonl (issue 32): one line per KV lifecycle event, merged per time, never token
ids; a scripted run's lines exactly."""

import json

import pytest

from pdjax.kv.audit import AUDIT_FIELDS, KvAudit
from test_host_tier_serving import _run


def test_lines_at_one_time_merge_by_event_tier_instance_and_tenant():
  now = [1.0]
  sink = []
  audit = KvAudit(lambda: now[0], sink)
  for _ in range(3):                                 # a 3-page eviction, each page offloaded
    audit.record("offload", "host", "i0", "tenant:a", 1, 10)
    audit.record("evict", "device", "i0", "tenant:a", 1, 10)
  audit.record("evict", "device", "i0", "tenant:b", 2, 10)
  assert sink == []                                  # the time's lines are still open
  now[0] = 2.0
  audit.record("reload", "host", "i1", "tenant:a", 2, 10)
  audit.close()
  assert sink == [
      {"t_s": 1.0, "event": "offload", "tier": "host", "instance": "i0", "tenant": "tenant:a",
       "pages": 3, "bytes": 30},
      {"t_s": 1.0, "event": "evict", "tier": "device", "instance": "i0", "tenant": "tenant:a",
       "pages": 3, "bytes": 30},
      {"t_s": 1.0, "event": "evict", "tier": "device", "instance": "i0", "tenant": "tenant:b",
       "pages": 2, "bytes": 20},
      {"t_s": 2.0, "event": "reload", "tier": "host", "instance": "i1", "tenant": "tenant:a",
       "pages": 2, "bytes": 20}]
  with pytest.raises(ValueError, match=r"^unknown KV audit event 'copy' \(known: offload, "
                                       r"reload, evict, expire, flush\)$"):
    audit.record("copy", "host", "i0", "tenant:a", 1, 10)


def test_a_scripted_run_offload_reload_flush(tmp_path):
  """test_host_tier_serving's run (one instance of 16 pages of 16 tokens, 16 KiB a page in the
  simulator) with tenant a flushed after the last request: the fillers at 2, 3 and 4 s evict
  2, 7 and 5 pages (X's 4 among the first 9), each offloaded as it goes; r4 at 4 s reloads X's
  4 pages; its own prompt's page goes when it finishes; the flush at the end forgets the 15
  pages the device still names and the 15 the host holds, a line for each place."""
  summary, result, _ = _run(tmp_path, 64, **{"kv.flush_tenants": "a@4.5"})
  lines = [{k: v for k, v in line.items() if k != "t_s"} for line in result.kv_audit]
  a = dict(instance="colocated-0", tenant="tenant:a")
  pages = lambda n: dict(pages=n, bytes=n * 16384)
  evicted = [dict(event=e, tier=t, **a, **pages(n)) for n in (2, 7, 5)
             for e, t in (("offload", "host"), ("evict", "device"))]
  assert lines == [
      *evicted,
      dict(event="reload", tier="host", **a, **pages(4)),
      dict(event="offload", tier="host", **a, **pages(1)),
      dict(event="evict", tier="device", **a, **pages(1)),
      dict(event="flush", tier="device", **a, **pages(15)),
      dict(event="flush", tier="host", instance="", tenant="tenant:a", **pages(15))]
  assert [line["t_s"] for line in result.kv_audit][:7] == [2.0, 2.0, 3.0, 3.0, 4.0, 4.0, 4.0]
  host = summary["kv_cache"]["host_tier"]
  assert (host["offloaded_pages"], host["hit_pages"], host["flushed_pages"]) == (15, 4, 15)
  for line in result.kv_audit:                 # nothing but the fields: no ids, no names
    assert tuple(line) == AUDIT_FIELDS
    assert all(isinstance(v, (int, float, str)) for v in line.values())


def test_the_run_folder_has_the_audit(tmp_path):
  from pdjax.runner.outputs import write_outputs
  summary, result, _ = _run(tmp_path, 64)
  from helpers import sim_snapshots
  cfg = sim_snapshots._config({"backend": "sim"})
  write_outputs(str(tmp_path / "run"), cfg, "colocated", summary, result)
  with open(tmp_path / "run" / "kv_audit.jsonl") as f:
    written = [json.loads(line) for line in f]
  assert written == list(result.kv_audit) and len(written) == 9
