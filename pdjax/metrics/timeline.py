"""Per-instance and per-role tier statistics from engine steps and sampled instance state,
plus reject-reason and preemption counts.

steps: {"instance", "role", "kind", "start_s", "end_s", "num_seqs", "num_tokens"}, one per
executed engine step. samples: {"t", "instance", "role", "queued", "running",
"kv_pages_used", "kv_pages_total"}, instance state sampled over time.

Sampled state is a step function: a sample holds until that instance's next sample, and
its last sample holds until max(duration_s, t). Means are weighted by those hold times;
where every weight is 0 (e.g. one sample at t = duration_s) they fall back to the plain
mean of the samples. Busy time is the union of an instance's step intervals clipped to
[0, duration_s]. A role aggregate counts every instance that ran a step or was sampled in
that role as a member for the whole run: its busy_fraction is the members' busy time in
that role's steps over members x duration_s; its state means are weighted over the
samples taken in that role (so they are per-instance averages, not tier sums).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from pdjax.request import Request, Status

STEP_KINDS = ("prefill", "decode", "mixed")
_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def busy_seconds(intervals: Iterable[tuple[float, float]], duration_s: float) -> float:
  """Length of the union of [start, end] intervals, clipped to [0, duration_s]."""
  spans = sorted((max(0.0, a), min(duration_s, b)) for a, b in intervals)
  total, cur_a, cur_b = 0.0, None, None
  for a, b in spans:
    if b <= a:
      continue
    if cur_b is None or a > cur_b:
      if cur_b is not None:
        total += cur_b - cur_a
      cur_a, cur_b = a, b
    else:
      cur_b = max(cur_b, b)
  if cur_b is not None:
    total += cur_b - cur_a
  return total


def _sample_weights(samples: Sequence[dict], duration_s: float) -> list[float]:
  """Hold time of each sample (same order as samples), per instance."""
  weights = [0.0] * len(samples)
  by_inst: dict[str, list[int]] = {}
  for i, s in enumerate(samples):
    by_inst.setdefault(s["instance"], []).append(i)
  for idx in by_inst.values():
    idx.sort(key=lambda i: samples[i]["t"])
    for j, i in enumerate(idx):
      t = float(samples[i]["t"])
      nxt = float(samples[idx[j + 1]]["t"]) if j + 1 < len(idx) else max(duration_s, t)
      weights[i] = nxt - t
  return weights


def _wmean(values: Sequence[float], weights: Sequence[float]) -> float | None:
  if not values:
    return None
  total = sum(weights)
  if total <= 0:
    return sum(values) / len(values)
  return sum(v * w for v, w in zip(values, weights)) / total


def _state_stats(samples: Sequence[dict], weights: Sequence[float]) -> dict:
  queued = [float(s["queued"]) for s in samples]
  running = [float(s["running"]) for s in samples]
  frac_pairs = [(s["kv_pages_used"] / s["kv_pages_total"], w)
                for s, w in zip(samples, weights) if s["kv_pages_total"] > 0]
  fracs = [f for f, _ in frac_pairs]
  return {
      "samples": len(samples),
      "queued": {"mean": _wmean(queued, weights),
                 "max": int(max(queued)) if queued else None},
      "running": {"mean": _wmean(running, weights),
                  "max": int(max(running)) if running else None},
      "kv_pages_used_max": max((int(s["kv_pages_used"]) for s in samples), default=None),
      "kv_used_frac_mean": _wmean(fracs, [w for _, w in frac_pairs]),
      "kv_used_frac_max": max(fracs, default=None),
  }


def _step_stats(steps: Sequence[dict]) -> dict:
  counts = {k: 0 for k in STEP_KINDS}
  tokens = {k: 0 for k in STEP_KINDS}
  hist: dict[str, dict[int, int]] = {k: {} for k in STEP_KINDS}
  for s in steps:
    kind = s["kind"]
    counts[kind] = counts.get(kind, 0) + 1
    tokens[kind] = tokens.get(kind, 0) + int(s["num_tokens"])
    h = hist.setdefault(kind, {})
    h[int(s["num_seqs"])] = h.get(int(s["num_seqs"]), 0) + 1
  return {
      "steps": counts,
      "steps_total": len(steps),
      "tokens": tokens,
      "batch_size_hist": {k: {str(n): h[n] for n in sorted(h)} for k, h in hist.items()},
  }


def _steps_by_instance(steps: Sequence[dict]) -> dict[str, list[dict]]:
  out: dict[str, list[dict]] = {}
  for s in steps:
    out.setdefault(s["instance"], []).append(s)
  return out


def tier_stats(steps: Sequence[dict], samples: Sequence[dict], duration_s: float) -> dict:
  """{"instances": {name: stats}, "roles": {role: stats}} (see the module docstring).

  Instance stats: roles (sorted), busy_fraction, samples, queued/running {mean, max},
  kv_pages_used_max, kv_used_frac_mean/max, steps {kind: count}, steps_total,
  tokens {kind: sum of num_tokens}, batch_size_hist {kind: {"num_seqs": count}}. Role
  stats have the same keys with instances (sorted member names) instead of roles.
  """
  if duration_s <= 0:
    raise ValueError(f"duration_s must be > 0, got {duration_s}")
  weights = _sample_weights(samples, duration_s)
  names = sorted({s["instance"] for s in steps} | {s["instance"] for s in samples})
  roles = sorted({s["role"] for s in steps} | {s["role"] for s in samples})

  def select(role: str | None = None, inst: str | None = None):
    sel = [(s, w) for s, w in zip(samples, weights)
           if (role is None or s["role"] == role) and (inst is None or s["instance"] == inst)]
    st = [s for s in steps
          if (role is None or s["role"] == role) and (inst is None or s["instance"] == inst)]
    return [s for s, _ in sel], [w for _, w in sel], st

  instances = {}
  for name in names:
    smp, w, st = select(inst=name)
    busy = busy_seconds(((s["start_s"], s["end_s"]) for s in st), duration_s)
    instances[name] = {
        "roles": sorted({s["role"] for s in st} | {s["role"] for s in smp}),
        "busy_fraction": busy / duration_s,
        **_state_stats(smp, w), **_step_stats(st)}

  by_role = {}
  for role in roles:
    smp, w, st = select(role=role)
    members = sorted({s["instance"] for s in st} | {s["instance"] for s in smp})
    busy = sum(busy_seconds(((s["start_s"], s["end_s"]) for s in group), duration_s)
               for group in _steps_by_instance(st).values())
    by_role[role] = {
        "instances": members,
        "busy_fraction": busy / (len(members) * duration_s),
        **_state_stats(smp, w), **_step_stats(st)}
  return {"instances": instances, "roles": by_role}


def reason_key(reason: str) -> str:
  """A reason with every number replaced by '#', so that reasons differing only in their
  numbers group together; '(no reason)' for an empty one."""
  reason = reason.strip()
  return _NUMBER.sub("#", reason) if reason else "(no reason)"


def rejects_by_reason(requests: Sequence[Request]) -> dict[str, int]:
  """Rejected and failed requests counted by reason_key(reason), most frequent first."""
  counts: dict[str, int] = {}
  for r in requests:
    if r.status in (Status.REJECTED, Status.FAILED):
      key = reason_key(r.reason)
      counts[key] = counts.get(key, 0) + 1
  return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def preemption_count(requests: Sequence[Request]) -> int:
  """Total preemptions (KV dropped and recomputed) over all requests."""
  return sum(int(r.preemptions) for r in requests)
