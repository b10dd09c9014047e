"""Prefix caching on the page pool: exact pages on hand-made cases, tenant isolation, flush,
eviction order, TTL and capacity, and a hypothesis state machine over random operations."""

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pdjax.kv.pages import BlockTables
from pdjax.kv.prefix_cache import page_hashes

PROMPT = list(range(100, 140))      # 40 tokens: 2 full pages of 16 + 8


def _tables(num_pages=8, **kw):
  t = BlockTables(num_pages, 16)
  t.enable_prefix_cache(**kw)
  return t


def test_second_request_reuses_the_full_pages():
  t = _tables()
  assert t.allocate_prefix("a", PROMPT, 41, "t1") == 0
  assert t.block_table("a") == [0, 1, 2]
  assert t.cache_computed("a", 40) == 2            # pages 0 and 1 are full; 2 is not
  t.free("a", now=1.0)
  assert t.num_used_pages == 0 and t.cache.num_evictable == 2
  assert t.allocate_prefix("b", PROMPT, 41, "t1") == 32
  assert t.block_table("b") == [0, 1, 2]
  assert t.allocator.refcount(0) == 2 and t.cache.num_evictable == 0
  t.check_invariants()
  # A prompt of exactly 2 pages still leaves its last token to compute: 1 page hit.
  assert t.allocate_prefix("c", PROMPT[:32], 33, "t1") == 16
  t.check_invariants()


def test_tenants_never_share_unless_a_shared_salt_is_given():
  t = _tables(num_pages=12)
  t.allocate_prefix("a", PROMPT, 41, "tenant-a")
  t.cache_computed("a", 40)
  assert t.allocate_prefix("b", PROMPT, 41, "tenant-b") == 0     # same prompt, other tenant
  t.cache_computed("b", 40)
  assert t.cache.num_cached == 4
  assert page_hashes("tenant-a", PROMPT, 16, 2) != page_hashes("tenant-b", PROMPT, 16, 2)
  assert t.allocate_prefix("s1", PROMPT, 41, "shared") == 0
  t.cache_computed("s1", 40)
  assert t.allocate_prefix("s2", PROMPT, 41, "shared") == 32


def test_flush_forgets_a_tenant_everywhere():
  t = _tables()
  t.allocate_prefix("a", PROMPT, 41, "t1")
  t.cache_computed("a", 40)
  t.allocate_prefix("b", PROMPT, 41, "t1")         # still holds pages 0 and 1
  t.free("a")
  assert t.cache.flush("t1") == 2
  assert t.cache.num_cached == 0 and t.block_table("b") == [0, 1, 3]
  t.check_invariants()
  t.free("b")
  assert t.num_used_pages == 0 and t.allocator.num_free == 8
  assert t.allocate_prefix("c", PROMPT, 41, "t1") == 0


def test_eviction_is_lru_and_on_demand():
  t = _tables(num_pages=4)
  for i, base in enumerate((0, 1000)):
    prompt = [base + j for j in range(17)]       # one full page each
    t.allocate_prefix(f"s{i}", prompt, 17, "t")
    t.cache_computed(f"s{i}", 17)
    t.free(f"s{i}", now=float(i))
  assert t.cache.num_evictable == 2 and t.num_free_pages == 4
  t.allocate("big", 16 * 3)                      # 3 pages: 2 free + the least recent idle one
  assert t.cache.stats["evictions"] == 1
  assert t.allocate_prefix("again", [0 + j for j in range(17)], 17, "t") is None   # no room
  t.free("big")
  assert t.allocate_prefix("again", [1000 + j for j in range(17)], 17, "t") == 16
  t.check_invariants()


def test_ttl_and_capacity():
  t = _tables(ttl_s=5.0)
  t.allocate_prefix("a", PROMPT, 41, "t")
  t.cache_computed("a", 40)
  t.free("a", now=1.0)
  assert t.allocate_prefix("b", PROMPT, 41, "t", now=7.0) == 0   # idle 6 s > 5 s: expired
  assert t.cache.stats["expiries"] == 2
  small = _tables(capacity_pages=1)
  small.allocate_prefix("a", PROMPT, 41, "t")
  assert small.cache_computed("a", 40) == 1


class PrefixCacheMachine(RuleBasedStateMachine):
  """Random allocate / compute / extend / free / evict / flush / expire over two tenants whose
  prompts share prefixes. Oracle: the bookkeeping invariants, and no hit across salts."""

  def __init__(self):
    super().__init__()
    self.t = _tables(num_pages=12, capacity_pages=8, ttl_s=3.0)
    self.seqs: dict[str, tuple[str, list[int], int]] = {}   # id -> (salt, tokens, len)
    self.now, self.n = 0.0, 0

  @rule(salt=st.sampled_from(["t1", "t2"]), prefix=st.integers(0, 2),
        extra=st.integers(1, 30))
  def allocate(self, salt, prefix, extra):
    tokens = list(range(prefix * 16, prefix * 16 + 16 * prefix)) + [7] * extra
    tokens = tokens or [7]
    sid = f"s{self.n}"
    self.n += 1
    cached = self.t.allocate_prefix(sid, tokens, len(tokens), salt, now=self.now)
    if cached is None:
      return
    assert cached % 16 == 0 and cached < len(tokens)
    for p in self.t.block_table(sid)[:cached // 16]:
      assert self.t.cache._entry[p][1] == salt      # a hit is always under the own salt
    self.seqs[sid] = (salt, tokens, len(tokens))

  @precondition(lambda self: self.seqs)
  @rule(data=st.data())
  def compute(self, data):
    sid = data.draw(st.sampled_from(sorted(self.seqs)))
    self.t.cache_computed(sid, self.seqs[sid][2], now=self.now)

  @precondition(lambda self: self.seqs)
  @rule(data=st.data(), grow=st.integers(1, 20))
  def extend(self, data, grow):
    sid = data.draw(st.sampled_from(sorted(self.seqs)))
    salt, tokens, n = self.seqs[sid]
    if self.t.can_allocate(16 * (self.t.pages_needed(n + grow) - len(self.t.block_table(sid)))):
      self.t.extend(sid, n + grow)
      self.seqs[sid] = (salt, tokens, n + grow)

  @precondition(lambda self: self.seqs)
  @rule(data=st.data())
  def free(self, data):
    sid = data.draw(st.sampled_from(sorted(self.seqs)))
    self.t.free(sid, now=self.now)
    del self.seqs[sid]

  @rule(n=st.integers(0, 4))
  def evict(self, n):
    self.t.cache.evict(n)

  @rule(salt=st.sampled_from(["t1", "t2"]))
  def flush(self, salt):
    self.t.cache.flush(salt)
    assert all(s != salt for _, s in self.t.cache._entry.values())

  @rule(dt=st.floats(0.0, 2.0))
  def tick(self, dt):
    self.now += dt
    self.t.cache.expire(self.now)

  @invariant()
  def bookkeeping(self):
    self.t.check_invariants()
    alloc = self.t.allocator
    assert all(rc >= 0 for rc in alloc._refcount)
    assert self.t.num_free_pages + self.t.num_used_pages == 12
    assert self.t.cache.num_cached <= 8


PrefixCacheMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40,
                                                deadline=None)
test_prefix_cache_state_machine = PrefixCacheMachine.TestCase


def test_a_tenant_flush_reaches_its_cache_salts_and_no_other_tenant():
  """vLLM's cache_salt narrows a tenant's salt (salt_for: "tenant:a/salt:x"): pages under it
  are the tenant's too, and its flush forgets them; tenant "ab" is not tenant "a"."""
  from pdjax.kv.host_tier import HostTier
  from pdjax.kv.prefix_cache import flush_tenant, salt_for
  t = _tables()
  tier = HostTier(8)
  t.attach_host(tier, lambda page, name, salt: None)
  salts = [salt_for("a"), salt_for("a", cache_salt="x"), salt_for("ab")]
  assert salts == ["tenant:a", "tenant:a/salt:x", "tenant:ab"]
  for i, salt in enumerate(salts):
    t.allocate_prefix(f"s{i}", [i * 100 + j for j in range(17)], 17, salt)
    t.cache_computed(f"s{i}", 17)
    t.free(f"s{i}")
    tier.offer(bytes([i]), salt, salt, None, writer="w", ready_s=0.0, now=0.0)
  assert flush_tenant([t], "a") == 4                 # 2 cached pages + 2 host pages
  assert t.cache.num_cached == 1 and len(tier) == 1 and bytes([2]) in tier


def test_prefix_hit_counts_stay_bounded_and_keep_the_hottest(monkeypatch):
  """Issue 47, item 5: a server that sees endless distinct prompts kept one prefix_hits entry
  per prompt for ever. Now the table is pruned to the TRACKED_PREFIXES most hit, and those
  keep their exact counts."""
  from pdjax.kv import prefix_cache as prefix_cache_lib
  monkeypatch.setattr(prefix_cache_lib, "TRACKED_PREFIXES", 4)
  t = _tables(num_pages=128)                        # nothing is evicted
  hot = list(range(500, 517))                       # one full page + 1
  t.allocate_prefix("h0", hot, 18, "t1")
  t.cache_computed("h0", 16)
  t.free("h0", now=0.0)
  for i in range(40):              # the hot prefix at i = 0, 13, 26, 39: 2 hits each
    prompt = hot if i % 13 == 0 else list(range(1000 + 17 * i, 1017 + 17 * i))
    t.allocate_prefix(f"r{i}", prompt, 18, "t1")
    t.cache_computed(f"r{i}", 16)
    t.free(f"r{i}", now=float(i + 1))
    t.allocate_prefix(f"again{i}", prompt, 18, "t1")  # a hit on the prefix just named
    t.free(f"again{i}", now=float(i + 1))
    assert len(t.cache.prefix_hits) <= 8 and len(t.cache.prefix_pages) <= 8
  hot_name = (("t1", page_hashes("t1", hot, 16, 1)[0]))
  assert t.cache.prefix_hits[hot_name] == 4 * 2        # exact: never pruned
  assert t.cache.prefix_pages[hot_name] == 1
  assert set(t.cache.prefix_pages) == set(t.cache.prefix_hits)
  t.check_invariants()
