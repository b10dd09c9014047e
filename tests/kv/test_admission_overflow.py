"""Issue 47 item 2: the frequency filter's count is a power of two kept as its exponent, so a
page hit 1,024 times (a system prompt's) is still decided, not an OverflowError out of
PrefixCache._offload that stopped the driver; decisions for small counts are unchanged
(tests/kv/test_offload_admission.py's histories, the simulator's snapshots)."""

import pytest

from pdjax.kv.host_tier import HostTier
from pdjax.kv.offload_admission import FrequencyFilter, make_admission
from pdjax.kv.pages import BlockTables
from pdjax.kv.prefix_cache import page_hashes


@pytest.mark.parametrize("admission", ["frequency", "adaptive"])
def test_a_page_hit_1024_times_is_offloaded_not_an_overflow(admission):
  tables, tier = BlockTables(4, 4), HostTier(4, admission=make_admission(admission))
  tables.enable_prefix_cache()
  offered = []
  tables.attach_host(tier, lambda page, name, salt: offered.append((page, name)))
  prompt = list(range(10, 15))
  for i in range(1025):                  # the first computes the page, 1,024 hit it
    tables.allocate_prefix(f"r{i}", prompt, 5, "tenant:a", now=float(i))
    tables.cache_computed(f"r{i}", 5, now=float(i))
    tables.free(f"r{i}", now=float(i))
  assert tables.cache.hits_of(0) == 1024
  tables.allocate("flood", 16)           # evicts it: admitted (2^1024 >= 2)
  assert offered == [(0, page_hashes("tenant:a", prompt, 4, 1)[0])]
  assert tier.stats["not_admitted"] == 0


def test_counts_far_past_a_float_decay_as_before():
  f = FrequencyFilter(half_life_s=60.0, memory=100)
  assert f.admit(b"p", "s", 5000, 0.0) is True
  assert f.log2_count(b"p", 0, 0.0) == 5001            # computed again: doubled
  assert f.count(b"p", 0, 0.0) == float("inf")         # (past a float's range)
  assert f.admit(b"p", "s", 0, 60.0 * 4999) is True    # 4,999 periods later: 2 x 2^5000 / ...
  assert f.log2_count(b"p", 0, 60.0 * 4999) == 3       # (each admit stores its count)
  assert f.admit(b"p", "s", 0, 60.0 * 5003) is False   # 4 more: 2 x 2^2 / 2^4 = 0.5
  assert f.count(b"p", 0, 60.0 * 5003) == 1.0          # (the stored 0.5, doubled)
