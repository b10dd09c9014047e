"""kv.host_tier_admission: which evicted device pages the host tier takes, decided on
hand-built hit histories (the policies), and in a simulated run (the tier's counts)."""

import pytest

from helpers import sim_snapshots
from helpers.host_tier_trace import trace_rows, write_trace
from pdjax import config as config_lib
from pdjax.kv.host_tier import HostTier
from pdjax.kv.offload_admission import FrequencyFilter, make_admission
from pdjax.runner.execute import execute


def test_all_takes_every_page_reused_only_pages_hit_on_the_device():
  every, reused = make_admission("all"), make_admission("reused")
  assert [every.admit(b"p", "s", hits, 0.0) for hits in (0, 1, 5)] == [True, True, True]
  assert [reused.admit(b"p", "s", hits, 0.0) for hits in (0, 1, 5)] == [False, True, True]


def test_the_frequency_filter_on_hand_built_histories():
  """Period 60 s. Each line: (name, hits while cached, last use) -> count, offloaded."""
  f = FrequencyFilter(half_life_s=60.0, memory=100)
  history = [
      (b"a", 0, 5.0, 1.0, False),     # computed once, never hit
      (b"a", 0, 30.0, 2.0, True),     # computed again in the same period: seen twice
      (b"b", 1, 5.0, 2.0, True),      # hit once on the device
      (b"c", 0, 50.0, 1.0, False),
      (b"c", 0, 70.0, 1.0, False),    # again, but a period boundary passed: 2 x 1 / 2
      (b"c", 0, 75.0, 2.0, True),     # and again in that period
      (b"d", 3, 0.0, 8.0, True),      # hot: 2^3
      (b"d", 0, 200.0, 2.0, True),    # 3 periods later: 2 x 8 / 8
      (b"d", 0, 400.0, 0.5, False),   # 3 more: 2 x 2 / 8
  ]
  for name, hits, when, count, admitted in history:
    assert (f.count(name, hits, when), f.admit(name, "s", hits, when)) == (count, admitted), name


def test_the_frequency_filter_forgets_the_least_recently_dropped_names():
  f = FrequencyFilter(half_life_s=60.0, memory=2)
  for name in (b"x", b"y", b"z"):
    assert f.admit(name, "s", 0, 1.0) is False
  assert f.admit(b"x", "s", 0, 2.0) is False         # forgotten: starts over at 1
  assert f.admit(b"z", "s", 0, 2.0) is True          # remembered: seen twice


def test_a_transferred_copy_is_not_a_new_use():
  """A prompt's page dropped by its prefill instance (count 1), then its copy on the decode
  instance (arrived by KV transfer, never hit there): still 1, not taken; hit once there: 2."""
  f = FrequencyFilter(half_life_s=60.0, memory=100)
  assert f.admit(b"p", "s", 0, 1.0) is False
  assert (f.count(b"p", 0, 2.0, copy=True), f.admit(b"p", "s", 0, 2.0, copy=True)) == (1.0, False)
  assert f.admit(b"p", "s", 1, 3.0, copy=True) is True
  # the other order: the decode copy dropped first, unused: no count; then its source's: 1
  assert f.admit(b"q", "s", 0, 1.0, copy=True) is False
  assert (f.count(b"q", 0, 2.0), f.admit(b"q", "s", 0, 2.0)) == (1.0, False)


def test_adaptive_takes_a_tenants_pages_while_its_reloads_pay_off():
  """Probation 4 offloads, ratio 0.5, window 8. Tenant a: 4 pages taken on probation, 1
  reloaded (0.25 < 0.5): its next one-off page is refused, a frequent one (hit once) taken;
  3 more reloads (4 / 5 >= 0.5): its pages are all taken again; past the window both counts
  halve."""
  from pdjax.kv.offload_admission import AdaptiveAdmission
  a = AdaptiveAdmission(FrequencyFilter(60.0, 100), min_ratio=0.5, probation=4, window=8)
  assert [a.admit(bytes([i]), "a", 0, 1.0) for i in range(4)] == [True] * 4
  a.reloaded("a", 1)
  assert a.admit(b"once", "a", 0, 1.0) is False
  assert a.admit(b"hit", "a", 1, 1.0) is True                   # (frequency: 2)
  assert a._tenants["a"] == [5.0, 1.0]
  a.reloaded("a", 3)
  assert a.admit(b"once-more", "a", 0, 1.0) is True
  assert a.pays_off("b") is True                                # a new tenant: probation
  for i in range(3):
    a.admit(bytes([10 + i]), "a", 0, 1.0)
  assert a._tenants["a"] == [4.5, 2.0]                          # 9 > 8: halved


def test_adaptive_keeps_the_counts_of_its_most_recent_tenants_only():
  from pdjax.kv.offload_admission import AdaptiveAdmission
  a = AdaptiveAdmission(FrequencyFilter(60.0, 100), max_tenants=2)
  for salt in ("a", "b", "c"):
    a.admit(b"p", salt, 0, 1.0)
  assert list(a._tenants) == ["b", "c"]
  a.reloaded("b", 1)
  assert list(a._tenants) == ["c", "b"]


def test_bad_names_and_parameters_are_one_line_errors():
  with pytest.raises(ValueError, match=r"^host tier admission 'some' is not one of all, "
                                       r"reused, frequency, adaptive$"):
    make_admission("some")
  with pytest.raises(ValueError, match=r"half_life_s 0 must be > 0 and memory 5 >= 1"):
    FrequencyFilter(0, 5)


def test_the_tier_counts_what_its_admission_refused():
  tier = HostTier(8, admission=make_admission("reused"))
  assert tier.admits(b"p", "s", 1, 0.0) and not tier.admits(b"q", "s", 0, 0.0)
  assert tier.stats["not_admitted"] == 1
  assert HostTier(8).admission.name == "all"


def _serve(tmp_path, admission, hit_before_eviction):
  """test_host_tier_serving's run: r0 caches X (4 pages), three fillers evict it, r4 asks for
  X again at 4 s; with hit_before_eviction another request takes X's 4 pages at 0.5 s (its own
  fifth page is new)."""
  rows = trace_rows(hit_at=0.5 if hit_before_eviction else None)
  path = tmp_path / "trace.jsonl"
  write_trace(path, rows)
  cfg = sim_snapshots._config({
      "backend": "sim", "mode": "colocated", "workload.kind": "jsonl",
      "workload.path": str(path), "workload.num_requests": len(rows),
      "cluster.colocated.instances": 1, "kv.page_size": 16, "kv.max_model_len": 128,
      "kv.pages_per_instance": 16, "kv.prefix_cache": True, "kv.host_tier_pages": 64,
      "kv.host_tier_admission": admission})
  summary, result, _ = execute(cfg, config_lib.validate(cfg), "colocated", None, quiet=True)
  assert summary["kv_pages_leaked"] == 0
  assert {r.status.value for r in result.requests} == {"finished"}
  return summary, result.requests[-1]


@pytest.mark.parametrize("admission,hit,offloaded,reloaded_tokens", [
    ("all", False, None, 64), ("reused", False, 0, 0), ("frequency", False, 0, 0),
    ("adaptive", False, None, 64),
    ("all", True, None, 64), ("reused", True, 4, 64), ("frequency", True, 4, 64)])
def test_only_admitted_pages_are_written_and_reloaded(tmp_path, admission, hit, offloaded,
                                                      reloaded_tokens):
  """Without a hit nothing of X (nor of the fillers, never reused) passes reused or frequency,
  so r4 recomputes X; once another request hit X's 4 pages, exactly those are written and r4
  reloads them. Every device eviction is either offered to the tier or not admitted."""
  summary, last = _serve(tmp_path, admission, hit)
  kv = summary["kv_cache"]
  host = kv["host_tier"]
  assert host["admission"] == admission
  assert last.cached_tokens == reloaded_tokens
  if offloaded is not None:
    assert host["offloaded_pages"] == offloaded
  offered = host["offloaded_pages"] + host["refused_pages"]
  assert offered + host["not_admitted_pages"] == kv["evictions"] + kv["expiries"]
  assert (host["not_admitted_pages"] == 0) == (admission in ("all", "adaptive"))  # (probation)


def test_the_kv_layer_section_counts_by_tier_and_names_hot_prefixes_by_hash(tmp_path):
  """With the hit at 0.5 s and admission reused: X's 4 pages (64 tokens) are tenant a's one hot
  prefix (hit once on the device); 4 pages offloaded, 4 reloaded, 16 KiB each."""
  from pdjax.metrics.report_sections import kv_layer_section
  summary, _ = _serve(tmp_path, "reused", True)
  kv, layer = summary["kv_cache"], summary["kv_layer"]
  [hot] = layer["hot_prefixes_by_tenant"]["tenant:a"]
  assert (hot["tokens"], hot["hits"], len(hot["prefix"])) == (64, 1, 12)
  assert (layer["offloaded_bytes"], layer["reloaded_bytes"], layer["cross_node_bytes"]) == (
      4 * 16384, 4 * 16384, 0)
  assert layer["evicted_pages"] == {"device": kv["evictions"], "host": 0}
  lines = kv_layer_section(layer)
  assert lines[2] == (f"- Pages evicted: device {kv['evictions']}, host 0; expired: device 0; "
                      "flushed: device 0, host 0")
  assert lines[3] == ("- Bytes offloaded to the host tier 0.06 MiB, reloaded 0.06 MiB, moved "
                      "across nodes 0.00 MiB (store reloads 0.00, P -> D 0.00)")
  assert lines[-2] == f"| {hot['prefix']} | 64 | 1 |"
