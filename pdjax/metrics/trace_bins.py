"""The bounded form of a run's Chrome trace (pdjax.metrics.trace): engine steps and KV counters
binned per instance and time, for runs with more steps than the trace's max_step_events.

Bins: one width for every instance, a 1-2-5 round number of seconds at least the run's span
(0 or the first step's start, to the last step's start) over max_step_events // instances, so
that there are at most max_step_events spans. A step belongs to the bin its start falls in.
Each (instance, bin) holding steps becomes one complete event on the instance's track, from
its first step's start to its last step's end, named by its steps' kind ("steps" when they
mix kinds), cat "step_bin", with args: steps, kinds {kind: count}, num_seqs and num_tokens
(sums), busy_fraction (its steps' time inside the bin over the bin's width, at most 1),
bin_s, and, for steps recorded with host timing, host_wait_s: the sum of their "waiting for
host" spans. Those spans are left out, and so are the "<instance> host" tracks (plan,
dispatch, readback; summary.json's host_time has their totals per tier). The KV counter
tracks keep one point per (instance, bin) holding samples, at its first sample, with the
bin's max used and cached pages. Role switches and requests are never binned. A global
instant event "trace binned" and a process label on process 1 say so and how to get every
step.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from pdjax.metrics import columns
from pdjax.metrics.trace_format import INSTANCES_PID, counter_event
from pdjax.metrics.trace_format import us as _us

FULL_DETAIL = "output.trace_steps=full (write_chrome_trace(max_step_events=None))"


def bin_index(t: np.ndarray, num_tracks: int, limit: int) -> tuple[np.ndarray, float, float]:
  """(bin of each time, bin width, first bin's start) for at most limit // num_tracks bins
  (at least one) over [min(0, t.min()), t.max()]."""
  bins = max(1, limit // max(1, num_tracks))
  t0 = min(0.0, float(t.min()))
  width = columns.round_width((float(t.max()) - t0) / bins)
  return np.clip(((t - t0) // width).astype(np.int64), 0, bins - 1), width, t0


def _groups(key: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(order sorting key stably, start offset of each run of equal keys in that order, the
  group of each element in that order)."""
  order = np.argsort(key, kind="stable")
  k = key[order]
  starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
  group = np.cumsum(np.r_[False, k[1:] != k[:-1]])
  return order, starts, group


def binned_steps(steps: Sequence[dict], tids: dict[str, int],
                 limit: int) -> tuple[list[dict], dict]:
  """(one X event per (instance, bin) holding steps, in instance then time order; info for
  notice_events: steps, spans, bin_s)."""
  code, inst_names = columns.codes(steps, "instance")
  inst = np.array([tids[n] for n in inst_names], np.int64)[code]
  kind, names = columns.codes(steps, "kind")
  start, end, seqs, tokens = columns.numbers(
      steps, ("start_s", "end_s", "num_seqs", "num_tokens"))
  seqs, tokens = seqs.astype(np.int64), tokens.astype(np.int64)
  timed = bool(columns.present(steps, "dispatched_s").any())
  b, width, t0 = bin_index(start, len(tids), limit)
  order, starts, group = _groups(inst * (b.max() + 1) + b)
  start, end, b = start[order], end[order], b[order]
  lo = t0 + b * width
  inside = np.clip(np.minimum(end, lo + width) - np.maximum(start, lo), 0.0, None)
  n = len(starts)
  per = {"steps": np.diff(np.r_[starts, len(order)]),
         "first": np.minimum.reduceat(start, starts), "last": np.maximum.reduceat(end, starts),
         "busy": np.minimum(1.0, np.bincount(group, inside, n) / width),
         "num_seqs": np.add.reduceat(seqs[order], starts),
         "num_tokens": np.add.reduceat(tokens[order], starts)}
  kinds = np.bincount(group * len(names) + kind[order],
                      minlength=n * len(names)).reshape(n, len(names))
  if timed:
    wait, = columns.numbers(steps, ("host_wait_s",), {"host_wait_s": 0.0})
    per["host_wait_s"] = np.add.reduceat(wait[order], starts)
  cols = {k: v.tolist() for k, v in per.items()}
  tid_of = inst[order][starts].tolist()
  spans = []
  for g, row in enumerate(kinds.tolist()):
    present = {names[k]: c for k, c in enumerate(row) if c}
    args = {"steps": cols["steps"][g], "kinds": present, "num_seqs": cols["num_seqs"][g],
            "num_tokens": cols["num_tokens"][g], "busy_fraction": round(cols["busy"][g], 4),
            "bin_s": width}
    if timed:
      args["host_wait_s"] = round(cols["host_wait_s"][g], 6)
    ts, te = _us(cols["first"][g]), _us(cols["last"][g])
    spans.append({"name": next(iter(present)) if len(present) == 1 else "steps",
                  "cat": "step_bin", "ph": "X", "ts": ts, "dur": max(0.0, round(te - ts, 3)),
                  "pid": INSTANCES_PID, "tid": tid_of[g], "args": args})
  return spans, {"steps": len(steps), "spans": n, "bin_s": width}


def notice_events(info: dict, limit: int) -> Iterator[dict]:
  """A process label on process 1 and a global instant event at t=0 saying the steps are
  binned (info from binned_steps) and how to get every step."""
  label = (f"{info['steps']} steps binned into {info['spans']} spans of {info['bin_s']:g} s "
           f"per instance; every step: {FULL_DETAIL}")
  yield {"name": "process_labels", "ph": "M", "pid": INSTANCES_PID, "tid": 0,
         "args": {"labels": label}}
  yield {"name": "trace binned", "cat": "notice", "ph": "i", "s": "g", "ts": 0.0,
         "pid": INSTANCES_PID, "tid": 0,
         "args": {**info, "max_step_events": limit, "full_detail": FULL_DETAIL,
                  "host_tracks": "left out; host waits summed in each span's host_wait_s",
                  "kv_counters": "max per instance per bin"}}


def binned_counters(samples: Sequence[dict], limit: int) -> list[dict]:
  """The "kv pages <instance>" counter points: per instance and bin (bin_index over the
  samples' times), one point at its first sample with the max used and cached pages."""
  inst, names = columns.codes(samples, "instance")
  t, used, cached = columns.numbers(samples, ("t", "kv_pages_used", "kv_pages_cached"),
                                    {"kv_pages_cached": 0})
  used, cached = used.astype(np.int64), cached.astype(np.int64)
  b, _, _ = bin_index(t, len(names), limit)
  order, starts, _ = _groups(inst * (b.max() + 1) + b)
  first = np.minimum.reduceat(t[order], starts).tolist()
  used_max = np.maximum.reduceat(used[order], starts).tolist()
  cached_max = np.maximum.reduceat(cached[order], starts).tolist()
  return [counter_event(names[i], ts, u, c) for i, ts, u, c in
          zip(inst[order][starts].tolist(), first, used_max, cached_max)]
