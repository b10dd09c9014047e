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

import numpy as np

from pdjax.metrics import columns
from pdjax.request import Request, Status

STEP_KINDS = ("prefill", "decode", "mixed")
_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def busy_seconds(intervals: Iterable[tuple[float, float]], duration_s: float) -> float:
  """Length of the union of [start, end] intervals, clipped to [0, duration_s]."""
  pairs = np.array(list(intervals), np.float64).reshape(-1, 2)
  return _union_busy(pairs[:, 0], pairs[:, 1], duration_s)


def _union_busy(start: np.ndarray, end: np.ndarray, duration_s: float) -> float:
  """busy_seconds of the intervals [start[i], end[i]]: sorted by start, an interval starting
  past the furthest end before it opens a new merged span; the spans' lengths summed in order
  (as a Python loop merging them would, to the last bit)."""
  a, b = np.maximum(start, 0.0), np.minimum(end, duration_s)
  keep = b > a
  a, b = a[keep], b[keep]
  if not len(a):
    return 0.0
  order = np.lexsort((b, a))
  a, b = a[order], b[order]
  opens = np.flatnonzero(np.r_[True, a[1:] > np.maximum.accumulate(b)[:-1]])
  return _sum(np.maximum.reduceat(b, opens) - a[opens])


def _sum(values: np.ndarray) -> float:
  """Left-to-right sum, as Python's sum() (numpy's sum adds pairwise: other last bits)."""
  return float(np.cumsum(values)[-1]) if len(values) else 0.0


def _sample_weights(inst: np.ndarray, t: np.ndarray, duration_s: float) -> np.ndarray:
  """Hold time of each sample (same order): until its instance's next sample (by time; ties
  in the given order), the last one until max(duration_s, t)."""
  in_time = len(t) < 2 or bool(np.all(t[1:] >= t[:-1]))   # as a run records them
  order = np.argsort(inst, kind="stable") if in_time else np.lexsort((t, inst))
  ts, same = t[order], inst[order]
  has_next = np.r_[same[1:] == same[:-1], False]
  nxt = np.where(has_next, np.r_[ts[1:], 0.0], np.maximum(duration_s, ts))
  weights = np.empty_like(t)
  weights[order] = nxt - ts
  return weights


def _wmean(values: np.ndarray, weights: np.ndarray) -> float | None:
  if not len(values):
    return None
  total = _sum(weights)
  if total <= 0:
    return _sum(values) / len(values)
  return _sum(values * weights) / total


def _state_stats(state: Sequence[np.ndarray], weights: np.ndarray) -> dict:
  """state: the samples' queued, running, kv_pages_used and kv_pages_total."""
  queued, running, used, total = state
  pooled = total > 0
  fracs = used[pooled] / total[pooled]
  n = len(queued)
  return {
      "samples": n,
      "queued": {"mean": _wmean(queued, weights), "max": int(queued.max()) if n else None},
      "running": {"mean": _wmean(running, weights), "max": int(running.max()) if n else None},
      "kv_pages_used_max": int(used.max()) if n else None,
      "kv_used_frac_mean": _wmean(fracs, weights[pooled]),
      "kv_used_frac_max": float(fracs.max()) if len(fracs) else None,
  }


def _step_stats(kind: np.ndarray, seqs: np.ndarray, tokens: np.ndarray,
                kind_names: list[str]) -> dict:
  """kind: codes into kind_names; STEP_KINDS first, then other kinds as they first occur."""
  counts = {k: 0 for k in STEP_KINDS}
  token_sums = {k: 0 for k in STEP_KINDS}
  hist: dict[str, dict[str, int]] = {k: {} for k in STEP_KINDS}
  for code in _first_seen(kind):
    name, mine = kind_names[code], kind == code
    counts[name] = int(mine.sum())
    token_sums[name] = int(tokens[mine].sum())
    sizes, n = np.unique(seqs[mine], return_counts=True)
    hist[name] = {str(s): c for s, c in zip(sizes.tolist(), n.tolist())}
  return {"steps": counts, "steps_total": len(kind), "tokens": token_sums,
          "batch_size_hist": hist}


def _shared_codes(a: Sequence[dict], b: Sequence[dict],
                  key: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
  """(codes of a's values of key, codes of b's, names): indices into names, the distinct
  values of both sorted."""
  (ca, na), (cb, nb) = columns.codes(a, key), columns.codes(b, key)
  names = sorted(set(na) | set(nb))
  index = {n: i for i, n in enumerate(names)}
  return (np.array([index[n] for n in na], np.int64)[ca],
          np.array([index[n] for n in nb], np.int64)[cb], names)


def _groups(codes: np.ndarray, n: int, index: np.ndarray | None = None) -> list[np.ndarray]:
  """For each code 0..n-1, the positions holding it in increasing order (index[positions]
  when index is given)."""
  order = np.argsort(codes, kind="stable")
  bounds = np.searchsorted(codes[order], np.arange(n + 1))
  if index is not None:
    order = index[order]
  return [order[bounds[i]:bounds[i + 1]] for i in range(n)]


def _first_seen(codes: np.ndarray) -> list[int]:
  """The distinct codes in order of first appearance."""
  distinct, first = np.unique(codes, return_index=True)
  return distinct[np.argsort(first)].tolist()


def _present(a: np.ndarray, b: np.ndarray, n: int) -> list[int]:
  """The codes (of 0..n-1) found in a or b, increasing."""
  return np.flatnonzero(np.bincount(a, minlength=n) + np.bincount(b, minlength=n)).tolist()


def tier_stats(steps: Sequence[dict], samples: Sequence[dict], duration_s: float) -> dict:
  """{"instances": {name: stats}, "roles": {role: stats}} (see the module docstring).

  Instance stats: roles (sorted), busy_fraction, samples, queued/running {mean, max},
  kv_pages_used_max, kv_used_frac_mean/max, steps {kind: count}, steps_total,
  tokens {kind: sum of num_tokens}, batch_size_hist {kind: {"num_seqs": count}}. Role
  stats have the same keys with instances (sorted member names) instead of roles.
  """
  if duration_s <= 0:
    raise ValueError(f"duration_s must be > 0, got {duration_s}")
  st_inst, sm_inst, names = _shared_codes(steps, samples, "instance")
  st_role, sm_role, roles = _shared_codes(steps, samples, "role")
  kind, kind_names = columns.codes(steps, "kind")
  start, end, seqs, tokens = columns.numbers(
      steps, ("start_s", "end_s", "num_seqs", "num_tokens"))
  seqs, tokens = seqs.astype(np.int64), tokens.astype(np.int64)
  t, *state = columns.numbers(
      samples, ("t", "queued", "running", "kv_pages_used", "kv_pages_total"))
  weights = _sample_weights(sm_inst, t, duration_s)

  def stats(st: np.ndarray, sm: np.ndarray) -> dict:
    return {**_state_stats([col[sm] for col in state], weights[sm]),
            **_step_stats(kind[st], seqs[st], tokens[st], kind_names)}

  st_by_inst, sm_by_inst = _groups(st_inst, len(names)), _groups(sm_inst, len(names))
  instances = {}
  for i, name in enumerate(names):
    st, sm = st_by_inst[i], sm_by_inst[i]
    instances[name] = {
        "roles": [roles[r] for r in _present(st_role[st], sm_role[sm], len(roles))],
        "busy_fraction": _union_busy(start[st], end[st], duration_s) / duration_s,
        **stats(st, sm)}

  by_role = {}
  for r, (st, sm) in enumerate(zip(_groups(st_role, len(roles)), _groups(sm_role, len(roles)))):
    members = _present(st_inst[st], sm_inst[sm], len(names))
    groups = _groups(st_inst[st], len(names), st)
    busy = sum(_union_busy(start[groups[i]], end[groups[i]], duration_s)   # in order of
               for i in _first_seen(st_inst[st]))                          # their first step
    by_role[roles[r]] = {
        "instances": [names[i] for i in members],
        "busy_fraction": busy / (len(members) * duration_s),
        **stats(st, sm)}
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
