"""The step records and state samples of decode segments (scheduler/decode_segments.py), kept
aside during a run and merged into the run's records (RecordTables) once, at its end.

A segment of m dispatches adds m state samples (one per dispatch: its start) and m - 1 step
records (one per collection). Most of their fields are the same for the whole segment, so a
segment costs a few list operations here, not 2m rows: the varying fields are lists extended
by the segment's, the rest one tuple per segment, repeated into columns at the end.

Where they go: each fast-forward's exit closes a window (`close_window`): the run's records
made during that fast-forward (rows mark..end) and the segments' made during it belong
together, in the order one step at a time appends them — by time (a step's end, a sample's
t), then worker, then the segments' before the fast-forward's own, each in the order it was
made. `merge_into` applies every window at once. Host logic (numpy only).
"""

from __future__ import annotations

import numpy as np

from pdjax.metrics.record_table import RecordTable


class SegmentRecords:

  def __init__(self):
    self._runs: list[tuple] = []   # (dispatches m, instance, role, rows n, running, total
                                   #  pages, cached idle pages) per segment
    self._starts: list[float] = []          # every dispatch's start (the samples' t)
    self._used: list[int] = []              # pages used, slots unused at each dispatch
    self._unused: list[int] = []
    self._ends: list[float] = []            # every collected step's end
    self.num_steps = self.num_samples = 0
    self.windows: tuple[list, list] = ([], [])   # steps', samples': (mark, end, first, last)
    self._closed = (0, 0)                   # segment rows already in a window

  def add(self, name: str, role: str, rows: int, running: int, total: int, cached: int,
          starts: list[float], ends: list[float], used: list[int], unused: list[int]) -> None:
    """A segment's records: dispatches at starts (len m), the first m - 1 collected at ends."""
    m = len(starts)
    self._runs.append((m, name, role, rows, running, total, cached))
    self._starts.extend(starts)
    self._ends.extend(ends)
    self._used.extend(used)
    self._unused.extend(unused)
    self.num_samples += m
    self.num_steps += m - 1

  def close_window(self, marks: tuple[int, int], ends: tuple[int, int]) -> None:
    """The run's records since marks (to ends: their lengths now) take the segment rows
    added since the last window."""
    made = (self.num_steps, self.num_samples)
    for windows, mark, end, first, last in zip(self.windows, marks, ends, self._closed, made):
      if last > first:
        windows.append((mark, end, first, last))
    self._closed = made

  def merge_into(self, steps: RecordTable, samples: RecordTable, worker_of: dict) -> None:
    """Merges every window into steps and samples; worker_of: instance name -> worker index."""
    made_steps, made_samples = self._tables(steps, samples)
    for records, made, windows, key in ((steps, made_steps, self.windows[0], "end_s"),
                                        (samples, made_samples, self.windows[1], "t")):
      if windows:
        _merge(records, made, windows, key, worker_of)
    self.__init__()

  def _tables(self, steps: RecordTable, samples: RecordTable):
    runs = self._runs
    m = np.fromiter((r[0] for r in runs), np.int64, len(runs))
    per = {k: np.fromiter((r[i] for r in runs), np.int64, len(runs))
           for i, k in ((3, "rows"), (4, "running"), (5, "total"), (6, "cached"))}
    codes = {(j, field): np.fromiter((table.code(field, r[i]) for r in runs), np.int32,
                                     len(runs))
             for j, table in enumerate((steps, samples))
             for i, field in ((1, "instance"), (2, "role"))}
    made_samples = samples.empty_like()
    n = self.num_samples
    made_samples.extend(n, {
        "t": self._starts, "instance": np.repeat(codes[1, "instance"], m),
        "role": np.repeat(codes[1, "role"], m), "queued": 0,
        "running": np.repeat(per["running"], m), "kv_pages_used": self._used,
        "kv_pages_total": np.repeat(per["total"], m),
        "kv_pages_cached": np.repeat(per["cached"], m), "kv_slots_unused": self._unused,
        "host_tier_pages": None})
    collected = np.ones(n, bool)   # every dispatch but each segment's last (left in flight)
    collected[np.cumsum(m) - 1] = False
    starts = np.asarray(self._starts, np.float64)[collected]
    rows = np.repeat(per["rows"], m - 1)
    made_steps = steps.empty_like()
    made_steps.extend(self.num_steps, {
        "instance": np.repeat(codes[0, "instance"], m - 1),
        "role": np.repeat(codes[0, "role"], m - 1), "kind": "decode", "start_s": starts,
        "end_s": self._ends, "num_seqs": rows, "num_tokens": rows, "ahead": False,
        "dispatched_s": starts, "done_s": self._ends, "plan_s": 0.0, "dispatch_s": 0.0,
        "build_s": 0.0, "readback_s": 0.0, "host_wait_s": 0.0})
    return made_steps, made_samples


def _merge(records: RecordTable, made: RecordTable, windows: list, key: str,
           worker_of: dict) -> None:
  n, k = len(records), len(made)
  group = np.arange(1, 2 * n + 1, 2, dtype=np.int64)   # a row outside windows: its own
  made_group = np.empty(k, np.int64)
  for mark, end, first, last in windows:
    group[mark:end] = 2 * mark                         # a window's rows: sorted together
    made_group[first:last] = 2 * mark
  t = np.concatenate([records.column(key), made.column(key)])
  code = np.concatenate([records.column("instance"), made.column("instance")])
  worker = np.array([worker_of[name] for name in records.names("instance")], np.int64)[code]
  theirs = np.r_[np.ones(n, np.int8), np.zeros(k, np.int8)]   # the fast-forward's: after
  records.take_from(0, np.lexsort((theirs, worker, t, np.r_[group, made_group])), made)
