"""The host KV tier's own rules (pdjax/kv/host_tier.py): pages readable only once landed and
only under their salt, eviction order (lru / lfu) among landed pages, writes refused when only
in-flight pages could make room, a dead writer's unlanded pages dropped, tenant flushes."""

import pytest

from pdjax.kv.host_tier import HostTier


def _offer(tier, name, *, salt="tenant:a", owner="a", writer="prefill-0", ready=0.0, now=0.0):
  return tier.offer(name, salt, owner, f"kv-{name.decode()}", writer=writer, ready_s=ready,
                    now=now)


def test_a_page_is_read_only_after_it_landed_and_only_under_its_salt():
  tier = HostTier(8)
  assert _offer(tier, b"p0", ready=1.0) and _offer(tier, b"p1", ready=2.0)
  assert tier.ready_prefix([b"p0", b"p1"], "tenant:a", now=0.5) == 0
  assert tier.ready_prefix([b"p0", b"p1"], "tenant:a", now=1.5) == 1
  assert tier.ready_prefix([b"p0", b"p1"], "tenant:a", now=2.0) == 2
  assert tier.ready_prefix([b"p0", b"p1"], "tenant:b", now=9.0) == 0
  assert tier.take([b"p0", b"p1"], "tenant:a", now=2.0) == ["kv-p0", "kv-p1"]
  with pytest.raises(KeyError, match="is not readable under 'tenant:b'"):
    tier.take([b"p0"], "tenant:b", now=3.0)
  assert tier.stats["hit_pages"] == 2 and tier.stats["offloaded"] == 2
  assert not _offer(tier, b"p0") and tier.stats["duplicates"] == 1


def test_lru_and_lfu_pick_different_victims():
  for policy, gone in (("lru", b"p0"), ("lfu", b"p1")):
    tier = HostTier(2, policy)
    _offer(tier, b"p0", now=0.0)
    _offer(tier, b"p1", now=1.0)
    tier.take([b"p0"], "tenant:a", now=2.0)
    tier.take([b"p0"], "tenant:a", now=3.0)
    tier.take([b"p1"], "tenant:a", now=4.0)        # p1 most recent, p0 most hit
    assert _offer(tier, b"p2", now=5.0)
    assert gone not in tier and len(tier) == 2, policy


def test_pages_in_flight_are_never_evicted():
  tier = HostTier(2)
  assert _offer(tier, b"p0", ready=10.0) and _offer(tier, b"p1", ready=10.0)
  assert not _offer(tier, b"p2", now=1.0)
  assert tier.stats["refused"] == 1 and b"p0" in tier and b"p1" in tier
  assert _offer(tier, b"p2", now=10.0)             # landed now: p0 (LRU) makes room
  assert b"p0" not in tier


def test_a_dead_writer_loses_only_its_unlanded_pages():
  tier = HostTier(8)
  _offer(tier, b"a0", writer="prefill-0", ready=1.0)
  _offer(tier, b"a1", writer="prefill-0", ready=5.0)
  _offer(tier, b"b0", writer="prefill-1", ready=5.0)
  assert tier.drop_writer("prefill-0", now=2.0) == 1
  assert b"a0" in tier and b"a1" not in tier and b"b0" in tier
  assert tier.stats["aborted"] == 1


def test_a_flush_forgets_one_tenant():
  tier = HostTier(8)
  _offer(tier, b"a0", salt="tenant:a", owner="a")
  _offer(tier, b"a1", salt="tenant:a", owner="a", ready=9.0)
  _offer(tier, b"b0", salt="tenant:b", owner="b")
  assert tier.pages_by_owner() == {"a": 2, "b": 1}
  assert tier.flush("tenant:a") == 2
  assert tier.pages_by_owner() == {"b": 1} and tier.stats["flushed"] == 2


def test_bad_settings():
  with pytest.raises(ValueError, match=r"capacity_pages must be >= 1, got 0"):
    HostTier(0)
  with pytest.raises(ValueError, match=r"policy must be one of \('lru', 'lfu'\), got 'fifo'"):
    HostTier(4, "fifo")


def test_the_summary_counts_pages_discarded_and_pages_lost_with_a_tier():
  """A sealed page that did not open is forgotten (discard); a tier whose store died loses
  what it held (lose): both reach summary.json's kv_cache.host_tier (issue 47: they were
  counted in the tier's stats but never reported)."""
  import types

  from pdjax.metrics.kv_cache import host_tier_summary
  tiers = [HostTier(8, node=0), HostTier(8, node=1)]
  for tier, names in zip(tiers, ([b"a0", b"a1", b"a2"], [b"b0", b"b1"])):
    for n in names:
      assert _offer(tier, n)
  assert tiers[0].discard([b"a1", b"zz"]) == 1
  assert tiers[1].lose() == 2
  instances = [types.SimpleNamespace(tables=types.SimpleNamespace(host=t), host_stats={})
               for t in tiers]
  summary = host_tier_summary(instances)
  assert (summary["discarded_pages"], summary["lost_pages"], summary["pages_at_end"],
          summary["offloaded_pages"]) == (1, 2, 2, 5)
