"""Issue 47 item 1: a host page taken for a reload stays in the tier (and in the store that
holds its bytes) until the reload has read it, whatever later admissions of the same plan
offload. Pure Python: BlockTables and a HostTier whose bytes sit in a dict (the node store
under Ray: `on_forget` drops them from it, as RemoteInstance's store.drop does).

The pool: 16 pages of 4 tokens. The tier: 8 pages, X's 4 and Y's 4 (landed). Z's 5 pages are
idle on the device. One plan: r4 (X + 1 token) reloads X's 4 pages from the tier, then r5
(44 tokens, 11 pages) takes the 6 free pages and evicts Z's 5, each offered to the full tier."""

import pytest

from pdjax.kv.host_tier import HostTier
from pdjax.kv.pages import BlockTables

SALT = "tenant:a"
X = list(range(100, 116))
Y = list(range(200, 216))
Z = list(range(300, 321))


def _cache(tables, seq, tokens, now):
  tables.allocate_prefix(seq, tokens, len(tokens), SALT, now)
  tables.cache_computed(seq, len(tokens), now)
  tables.free(seq, now)


def _setup(policy="lru"):
  tables, tier, store = BlockTables(16, 4), HostTier(8, policy), {}
  tables.enable_prefix_cache()

  def offload(page, name, salt):   # (a store write that has landed: the engine's ready_s=0)
    if tier.offer(name, salt, salt, name, writer="colocated-0", ready_s=0.0, now=0.0):
      store[name] = f"bytes of page {page}"
  tables.attach_host(tier, offload)
  tier.on_forget = lambda names: [store.pop(n) for n in names]
  _cache(tables, "x", X + [1], 0.0)     # X: 4 named pages (one token is left to compute)
  _cache(tables, "y", Y + [1], 1.0)
  tables.allocate("fill", 16 * 4)       # evicts X's then Y's pages into the tier
  tables.free("fill", 2.0)
  _cache(tables, "z", Z, 3.0)           # Z: 5 named pages, idle on the device
  assert (len(tier), len(store), tables.num_cached_idle_pages) == (8, 8, 5)
  return tables, tier, store


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_a_page_taken_for_reload_is_not_evicted_before_it_is_read(policy):
  """lru: X's taken pages are the most recent, the fifth offer would evict one; lfu: the first
  would (Y's pages were hit twice, X's once). Pinned, they stay and the reload reads every
  byte: lru evicts Y's 4, then Z's first (just written); lfu Y's first, then the new Z's
  (no host hits) as they come."""
  tables, tier, store = _setup(policy)
  x_names, y_names = list(store)[:4], list(store)[4:]
  if policy == "lfu":
    for t in (4.0, 5.0):
      tier.take(y_names, SALT, t)
  assert tables.allocate_prefix("r4", X + [7], 17, SALT, now=6.0) == 16   # 4 pages reloaded
  assert tables.allocate("r5", 44) == [0, 1, 2, 3, 4, 10, 11, 12, 13, 14, 15]
  loads, release = tables.take_loads_held()
  assert loads == list(zip([5, 6, 7, 8], x_names))
  assert [store[name] for _, name in loads] == [
      "bytes of page 0", "bytes of page 1", "bytes of page 2", "bytes of page 3"]
  release()
  assert (tier.stats["evictions"], tier.stats["refused"]) == (5, 0)
  kept_y = {"lru": [False] * 4, "lfu": [False, True, True, True]}[policy]
  assert [name in tier for name in x_names + y_names] == [True] * 4 + kept_y
  assert len(tier) == len(store) == 8 and tier.pinned() == 0


def test_the_pins_go_once_read_or_with_a_sequence_freed_unread():
  tables, tier, store = _setup()
  x_names = list(store)[:4]
  tables.allocate_prefix("r4", X + [7], 17, SALT, now=6.0)
  assert tables.take_loads() == list(zip([5, 6, 7, 8], x_names))   # (written now: let go)
  tables.allocate("r5", 44)             # Z's 5 pages offered: Y's 4 and X's first evicted
  assert (tier.stats["evictions"], tier.stats["refused"]) == (5, 0)
  assert x_names[0] not in tier and x_names[0] not in store
  tables, tier, store = _setup()
  tables.allocate_prefix("r4", X + [7], 17, SALT, now=6.0)
  tables.free("r4", 7.0)                # never read: its pins go with its pages
  assert tables.pending_loads == {}
  tables.allocate("r5", 64)
  assert (tier.stats["evictions"], tier.stats["refused"]) == (5, 0)
  tables.free("r5", 8.0)
  tables.check_invariants()


def test_a_flushed_page_taken_for_reload_leaves_the_store_once_read():
  """The tier forgets the tenant at once (no later lookup finds it; the audit's count); the
  store keeps the bytes a planned reload reads until it has read them, then drops them."""
  tables, tier, store = _setup()
  x_names = list(store)[:4]
  tables.allocate_prefix("r4", X + [7], 17, SALT, now=6.0)
  assert tier.flush(SALT) == 8 and len(tier) == 0 and tier.stats["flushed"] == 8
  assert list(store) == x_names         # X's, pinned by r4's reload
  loads, release = tables.take_loads_held()
  assert [store[name] for _, name in loads] == [
      "bytes of page 0", "bytes of page 1", "bytes of page 2", "bytes of page 3"]
  release()
  assert store == {}
  release()                             # (once only)
  assert store == {}


def test_a_lost_tier_drops_what_its_store_held():
  """HostTier.lose (its store gone, or not answering): a store still alive keeps nothing."""
  _, tier, store = _setup()
  assert tier.lose() == 8 and store == {} and tier.lost
