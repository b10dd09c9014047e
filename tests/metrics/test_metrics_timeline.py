"""Tests for pdjax.metrics.timeline: tier stats, reject grouping, preemptions (hand-made
inputs, hand-computed numbers); tier_stats equal to its per-sample Python version on simulated
and random records."""

import pytest

from pdjax.metrics.summary import summarize_extras
from pdjax.metrics.timeline import (busy_seconds, preemption_count, reason_key,
                                    rejects_by_reason, tier_stats)
from pdjax.request import Request, Status


def step(inst, role, kind, start, end, num_seqs, num_tokens=1):
  return {"instance": inst, "role": role, "kind": kind, "start_s": start, "end_s": end,
          "num_seqs": num_seqs, "num_tokens": num_tokens}


def sample(t, inst, role, queued, running, used, total):
  return {"t": t, "instance": inst, "role": role, "queued": queued, "running": running,
          "kv_pages_used": used, "kv_pages_total": total}


STEPS = [
    step("p0", "prefill", "prefill", 0.0, 1.0, 2, 100),
    step("p0", "prefill", "prefill", 0.5, 1.5, 2, 50),   # overlaps the first
    step("p0", "prefill", "mixed", 3.0, 4.0, 1, 10),
    step("d0", "decode", "decode", 1.0, 2.0, 4, 4),
    step("d0", "decode", "decode", 2.0, 3.0, 4, 4),      # touches the previous one
    step("d0", "decode", "decode", 5.0, 12.0, 1, 1),     # clipped at duration 10
]
SAMPLES = [
    sample(0.0, "p0", "prefill", 4, 0, 0, 100),
    sample(6.0, "p0", "prefill", 0, 0, 10, 100),          # out of order on purpose
    sample(2.0, "p0", "prefill", 2, 1, 50, 100),
    sample(1.0, "d0", "decode", 0, 4, 20, 40),
    sample(5.0, "d0", "decode", 1, 1, 10, 40),
]


def test_busy_seconds_union_and_clip():
  assert busy_seconds([(0, 1), (0.5, 1.5), (3, 4)], 10) == 2.5
  assert busy_seconds([(1, 2), (2, 3), (5, 12)], 10) == 7.0
  assert busy_seconds([(-1, 1), (0.2, 0.4), (2, 2)], 10) == 1.0
  assert busy_seconds([], 10) == 0.0


def test_tier_stats_per_instance():
  t = tier_stats(STEPS, SAMPLES, 10.0)
  assert list(t["instances"]) == ["d0", "p0"]
  p0, d0 = t["instances"]["p0"], t["instances"]["d0"]
  assert p0["roles"] == ["prefill"] and d0["roles"] == ["decode"]
  assert p0["busy_fraction"] == pytest.approx(0.25)
  assert d0["busy_fraction"] == pytest.approx(0.7)
  # p0 samples hold 2 s, 4 s and 4 s (the last one until duration).
  assert p0["samples"] == 3
  assert p0["queued"] == {"mean": pytest.approx(1.6), "max": 4}
  assert p0["running"] == {"mean": pytest.approx(0.4), "max": 1}
  assert p0["kv_pages_used_max"] == 50
  assert p0["kv_used_frac_mean"] == pytest.approx(0.24)
  assert p0["kv_used_frac_max"] == 0.5
  # d0 samples hold 4 s and 5 s.
  assert d0["queued"] == {"mean": pytest.approx(5 / 9), "max": 1}
  assert d0["running"] == {"mean": pytest.approx(21 / 9), "max": 4}
  assert d0["kv_used_frac_mean"] == pytest.approx((0.5 * 4 + 0.25 * 5) / 9)
  assert p0["steps"] == {"prefill": 2, "decode": 0, "mixed": 1}
  assert p0["steps_total"] == 3
  assert p0["tokens"] == {"prefill": 150, "decode": 0, "mixed": 10}
  assert p0["batch_size_hist"] == {"prefill": {"2": 2}, "decode": {}, "mixed": {"1": 1}}
  assert d0["batch_size_hist"]["decode"] == {"1": 1, "4": 2}
  assert list(d0["batch_size_hist"]["decode"]) == ["1", "4"]


def test_tier_stats_roles_with_a_role_switch():
  steps = [step("x", "prefill", "prefill", 0, 2, 3), step("x", "decode", "decode", 4, 5, 2),
           step("y", "decode", "decode", 0, 8, 5)]
  samples = [sample(0, "x", "prefill", 2, 1, 1, 10), sample(4, "x", "decode", 6, 3, 5, 10)]
  t = tier_stats(steps, samples, 8.0)
  x = t["instances"]["x"]
  assert x["roles"] == ["decode", "prefill"]
  assert x["busy_fraction"] == pytest.approx(3 / 8)
  assert x["queued"]["mean"] == pytest.approx(4.0)
  pre, dec = t["roles"]["prefill"], t["roles"]["decode"]
  assert pre["instances"] == ["x"] and dec["instances"] == ["x", "y"]
  assert pre["busy_fraction"] == pytest.approx(2 / 8)
  assert dec["busy_fraction"] == pytest.approx(9 / 16)
  assert pre["queued"] == {"mean": 2.0, "max": 2}
  assert dec["queued"] == {"mean": 6.0, "max": 6}
  assert dec["kv_used_frac_mean"] == 0.5
  assert dec["batch_size_hist"]["decode"] == {"2": 1, "5": 1}
  assert pre["steps_total"] == 1 and dec["steps_total"] == 2


def test_tier_stats_fallbacks():
  # One sample at t = duration has zero hold time: plain mean of the samples.
  t = tier_stats([], [sample(10, "a", "decode", 3, 2, 0, 0)], 10.0)
  a = t["instances"]["a"]
  assert a["queued"] == {"mean": 3.0, "max": 3}
  assert a["busy_fraction"] == 0.0
  assert a["kv_used_frac_mean"] is None and a["kv_used_frac_max"] is None
  # Steps but no samples.
  b = tier_stats([step("b", "decode", "decode", 0, 1, 1)], [], 4.0)["instances"]["b"]
  assert b["queued"] == {"mean": None, "max": None} and b["busy_fraction"] == 0.25
  assert tier_stats([], [], 1.0) == {"instances": {}, "roles": {}}
  with pytest.raises(ValueError):
    tier_stats([], [], 0.0)


def test_state_means_are_weighted_by_hold_time():
  """Issue 24: a queue that drains right after a dispatch counts for the time it held. p0 is
  queued 1 for 0.1 s (its one prefill step, 0-0.1 s), then 0 for 9.9 s; p1 queues 2 from 5 s
  and runs 1 from 7.5 s to the end. Means over the 10 s run, busy from the step spans."""
  steps = [step("p0", "prefill", "prefill", 0.0, 0.1, 1), step("p1", "prefill", "prefill",
                                                                5.0, 7.5, 2)]
  samples = [sample(0.0, "p0", "prefill", 1, 0, 2, 32), sample(0.1, "p0", "prefill", 0, 0, 0, 32),
             sample(0.0, "p1", "prefill", 0, 0, 0, 32), sample(5.0, "p1", "prefill", 2, 0, 8, 32),
             sample(7.5, "p1", "prefill", 0, 1, 16, 32)]
  t = tier_stats(steps, samples, 10.0)
  p0, p1, tier = t["instances"]["p0"], t["instances"]["p1"], t["roles"]["prefill"]
  assert p0["queued"] == {"mean": 0.01, "max": 1}
  assert p0["busy_fraction"] == 0.01
  assert p0["kv_used_frac_mean"] == 2 / 32 * 0.1 / 10
  assert p1["queued"] == {"mean": 2 * 2.5 / 10, "max": 2}
  assert p1["running"] == {"mean": 2.5 / 10, "max": 1}
  assert p1["kv_used_frac_mean"] == (8 * 2.5 + 16 * 2.5) / 32 / 10
  assert p1["busy_fraction"] == 0.25
  # The tier: per-instance means over both instances' 20 instance-seconds.
  assert tier["queued"]["mean"] == pytest.approx((0.1 + 5) / 20, rel=1e-15)
  assert tier["running"]["mean"] == 2.5 / 20
  assert tier["busy_fraction"] == pytest.approx(2.6 / 20, rel=1e-15)


def make(rid, status, reason="", preemptions=0):
  r = Request(id=rid, arrival_s=0.0, prompt_ids=[1])
  r.preemptions = preemptions
  if status == Status.FINISHED:
    r.add_token(5, 0.1)
  r.finish(status, 0.1, reason)
  return r


REQS = [
    make("a", Status.REJECTED, "prompt_len = 5000 exceeds the prefill token budget 4096"),
    make("b", Status.REJECTED, "prompt_len = 6000 exceeds the prefill token budget 4096"),
    make("c", Status.FAILED, "kv transfer failed: timeout after 1.5 s", preemptions=1),
    make("d", Status.REJECTED, ""),
    make("e", Status.FINISHED, "ignored: finished", preemptions=2),
]


def test_rejects_by_reason_and_preemptions():
  assert reason_key("needs 12 pages, 3e-2 s, 7.5 GiB") == "needs # pages, # s, # GiB"
  got = rejects_by_reason(REQS)
  assert got == {"prompt_len = # exceeds the prefill token budget #": 2,
                 "(no reason)": 1, "kv transfer failed: timeout after # s": 1}
  assert list(got)[0].startswith("prompt_len") and list(got)[1] == "(no reason)"
  assert rejects_by_reason([]) == {}
  assert preemption_count(REQS) == 3 and preemption_count([]) == 0


def test_summarize_extras():
  sw = [{"t": 1.0, "instance": "x", "from": "prefill", "to": "decode"}]
  remesh = [{"t_s": 2.0, "role": "decode", "from": "2x1", "to": "1x2"}]
  ex = summarize_extras(REQS, duration_s=10.0, steps=STEPS, samples=SAMPLES,
                        role_switches=sw, remesh_events=remesh)
  assert set(ex) == {"preemptions", "rejects_by_reason", "tiers", "role_switches",
                     "host_overhead", "host_time", "paths", "remesh_events"}
  assert ex["preemptions"] == 3 and ex["role_switches"] == sw
  assert ex["remesh_events"] == remesh
  assert ex["tiers"] == tier_stats(STEPS, SAMPLES, 10.0)


# --- tier_stats before numpy (per-sample Python), as the reference: the numpy version must
# give the same stats (floats to the last bit) with the same keys in the same order.

def _old_busy(intervals, duration_s):
  total, cur_a, cur_b = 0.0, None, None
  for a, b in sorted((max(0.0, a), min(duration_s, b)) for a, b in intervals):
    if b <= a:
      continue
    if cur_b is None or a > cur_b:
      total += 0.0 if cur_b is None else cur_b - cur_a
      cur_a, cur_b = a, b
    else:
      cur_b = max(cur_b, b)
  return total + (0.0 if cur_b is None else cur_b - cur_a)


def _old_weights(samples, duration_s):
  weights, by_inst = [0.0] * len(samples), {}
  for i, s in enumerate(samples):
    by_inst.setdefault(s["instance"], []).append(i)
  for idx in by_inst.values():
    idx.sort(key=lambda i: samples[i]["t"])
    for j, i in enumerate(idx):
      t = float(samples[i]["t"])
      nxt = float(samples[idx[j + 1]]["t"]) if j + 1 < len(idx) else max(duration_s, t)
      weights[i] = nxt - t
  return weights


def _old_wmean(values, weights):
  if not values:
    return None
  total = sum(weights)
  if total <= 0:
    return sum(values) / len(values)
  return sum(v * w for v, w in zip(values, weights)) / total


def _old_state(samples, weights):
  queued = [float(s["queued"]) for s in samples]
  running = [float(s["running"]) for s in samples]
  pairs = [(s["kv_pages_used"] / s["kv_pages_total"], w)
           for s, w in zip(samples, weights) if s["kv_pages_total"] > 0]
  fracs = [f for f, _ in pairs]
  return {"samples": len(samples),
          "queued": {"mean": _old_wmean(queued, weights),
                     "max": int(max(queued)) if queued else None},
          "running": {"mean": _old_wmean(running, weights),
                      "max": int(max(running)) if running else None},
          "kv_pages_used_max": max((int(s["kv_pages_used"]) for s in samples), default=None),
          "kv_used_frac_mean": _old_wmean(fracs, [w for _, w in pairs]),
          "kv_used_frac_max": max(fracs, default=None)}


def _old_steps(steps):
  kinds = ("prefill", "decode", "mixed")
  counts, tokens, hist = ({k: 0 for k in kinds}, {k: 0 for k in kinds},
                          {k: {} for k in kinds})
  for s in steps:
    kind = s["kind"]
    counts[kind] = counts.get(kind, 0) + 1
    tokens[kind] = tokens.get(kind, 0) + int(s["num_tokens"])
    h = hist.setdefault(kind, {})
    h[int(s["num_seqs"])] = h.get(int(s["num_seqs"]), 0) + 1
  return {"steps": counts, "steps_total": len(steps), "tokens": tokens,
          "batch_size_hist": {k: {str(n): h[n] for n in sorted(h)} for k, h in hist.items()}}


def old_tier_stats(steps, samples, duration_s):
  weights = _old_weights(samples, duration_s)
  names = sorted({s["instance"] for s in steps} | {s["instance"] for s in samples})
  roles = sorted({s["role"] for s in steps} | {s["role"] for s in samples})

  def select(role=None, inst=None):
    ok = lambda s: (role is None or s["role"] == role) and (inst is None or s["instance"] == inst)
    sel = [(s, w) for s, w in zip(samples, weights) if ok(s)]
    return [s for s, _ in sel], [w for _, w in sel], [s for s in steps if ok(s)]

  instances = {}
  for name in names:
    smp, w, st = select(inst=name)
    busy = _old_busy(((s["start_s"], s["end_s"]) for s in st), duration_s)
    instances[name] = {"roles": sorted({s["role"] for s in st} | {s["role"] for s in smp}),
                       "busy_fraction": busy / duration_s, **_old_state(smp, w),
                       **_old_steps(st)}
  by_role = {}
  for role in roles:
    smp, w, st = select(role=role)
    members = sorted({s["instance"] for s in st} | {s["instance"] for s in smp})
    stepped = list(dict.fromkeys(s["instance"] for s in st))   # in order of their first step,
    busy = sum(_old_busy(((s["start_s"], s["end_s"]) for s in st if s["instance"] == m),
                         duration_s) for m in stepped)         # as the first version summed
    by_role[role] = {"instances": members, "busy_fraction": busy / (len(members) * duration_s),
                     **_old_state(smp, w), **_old_steps(st)}
  return {"instances": instances, "roles": by_role}


def assert_same(got, want, path="stats"):
  """Equal with the same key order and types, floats to the last bit (summary.json, and so the
  sim snapshots, must not move)."""
  if isinstance(want, dict):
    assert isinstance(got, dict) and list(got) == list(want), path
    for k in want:
      assert_same(got[k], want[k], f"{path}.{k}")
  else:
    assert got == want and type(got) is type(want), (path, got, want)


def sim_result(name, run="disaggregated"):
  from helpers.sim_snapshots import CONFIGS, _config
  from pdjax import config as config_lib
  from pdjax.runner.execute import execute
  cfg = _config(CONFIGS[name])
  _, result, _ = execute(cfg, config_lib.validate(cfg), run, None, quiet=True)
  return result


@pytest.mark.parametrize("name,run", [("role_switch", "disaggregated"), ("base", "chunked"),
                                      ("prefix_faults", "disaggregated")])
def test_tier_stats_matches_the_reference_on_sim_runs(name, run):
  r = sim_result(name, run)
  for duration in (r.duration_s, r.duration_s / 2):   # the second clips steps and samples
    assert_same(tier_stats(r.steps, r.samples, duration),
                old_tier_stats(r.steps, r.samples, duration))


def test_tier_stats_matches_the_reference_on_random_records():
  """Overlapping steps, ties and disorder in sample times, empty pools, an unknown kind."""
  import random
  rng = random.Random(0)
  steps, samples = [], []
  for _ in range(400):
    a = rng.uniform(-1, 11)
    steps.append(step(rng.choice("xyz"), rng.choice(["prefill", "decode"]),
                      rng.choice(["prefill", "decode", "mixed", "spec"]), a,
                      a + rng.choice([0, rng.uniform(0, 2)]), rng.randint(1, 9),
                      rng.randint(1, 500)))
    samples.append(sample(rng.choice([rng.uniform(0, 12), 5.0]), rng.choice("xyw"),
                          rng.choice(["prefill", "decode"]), rng.randint(0, 9),
                          rng.randint(0, 9), rng.randint(0, 40), rng.choice([0, 40, 64])))
  assert_same(tier_stats(steps, samples, 10.0), old_tier_stats(steps, samples, 10.0))
  assert_same(tier_stats(STEPS, SAMPLES, 10.0), old_tier_stats(STEPS, SAMPLES, 10.0))


def test_numbers_fill_a_missing_key_with_its_default_or_raise():
  from pdjax.metrics import columns
  assert columns.numbers([{"x": 1.0}, {}], ("x",), {"x": 5.0})[0].tolist() == [1.0, 5.0]
  with pytest.raises(KeyError):
    columns.numbers([{"x": 1.0}, {}], ("x",))
