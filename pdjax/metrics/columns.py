"""Columns of numpy arrays from a run's records (steps, state samples), for the metrics that
summarize hundreds of thousands of them (tier stats, the binned trace and plot), and the round
bin widths those bin time by.

A run's records are a RecordTable (metrics/record_table.py): its columns are read as they
are. Any other sequence of dicts (a spilled server run's, a hand-written list) is read key by
key, one pass over the dicts per key.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from operator import itemgetter

import numpy as np

from pdjax.metrics.record_table import RecordTable


def _number(records: Sequence[dict], key: str, default: float | None) -> np.ndarray:
  try:   # one pass in C (the common case: every record has the key)
    return np.fromiter(map(itemgetter(key), records), np.float64, len(records))
  except KeyError:
    if default is None:
      raise
    return np.fromiter((r.get(key, default) for r in records), np.float64, len(records))


def numbers(records: Sequence[dict], keys: Sequence[str],
            defaults: dict[str, float] | None = None) -> list[np.ndarray]:
  """[float64 array of each record's value of key for key in keys]; a key missing from a
  record takes defaults[key] (KeyError when it has none)."""
  defaults = defaults or {}
  if isinstance(records, RecordTable):
    return [_table_number(records, k, defaults.get(k)) for k in keys]
  return [_number(records, k, defaults.get(k)) for k in keys]


def codes(records: Sequence[dict], key: str) -> tuple[np.ndarray, list[str]]:
  """(int64 array: the index of each record's value of key in names, names: the distinct
  values sorted)."""
  if isinstance(records, RecordTable):
    return _table_codes(records, key)

  values = list(map(itemgetter(key), records))
  names = sorted(set(values))
  index = {n: i for i, n in enumerate(names)}
  return np.fromiter(map(index.__getitem__, values), np.int64, len(values)), names


def present(records: Sequence[dict], key: str) -> np.ndarray:
  """bool array: whether each record has key."""
  if isinstance(records, RecordTable):
    if key not in records.index:
      return np.zeros(len(records), bool)
    return ~np.isnan(records.column(key)) if records.fields[records.index[key]].optional \
        else np.ones(len(records), bool)
  return np.fromiter((key in r for r in records), bool, len(records))


def _table_number(table: RecordTable, key: str, default: float | None) -> np.ndarray:
  if key not in table.index:
    if default is None and len(table):
      raise KeyError(key)
    return np.full(len(table), np.nan if default is None else default, np.float64)
  if table.fields[table.index[key]].kind == "str":
    raise TypeError(f"{key} holds names, not numbers (columns.codes)")
  column = table.column(key).astype(np.float64)
  if table.fields[table.index[key]].optional:
    absent = np.isnan(column)
    if absent.any():
      if default is None:
        raise KeyError(key)
      column[absent] = default
  column.flags.writeable = False
  return column


def _table_codes(table: RecordTable, key: str) -> tuple[np.ndarray, list[str]]:
  """codes() of a RecordTable: its str column re-coded to the sorted names present."""
  column = table.column(key)
  names = table.names(key)
  used = np.zeros(len(names), bool)
  used[column] = True
  kept = sorted(names[i] for i in np.flatnonzero(used).tolist())
  code = {name: i for i, name in enumerate(names)}
  recode = np.full(len(names), -1, np.int64)
  for j, name in enumerate(kept):
    recode[code[name]] = j
  out = recode[column]
  out.flags.writeable = False
  return out, kept


def round_width(seconds: float) -> float:
  """The smallest 1, 2 or 5 x 10^k at least seconds (1.0 for seconds <= 0)."""
  if seconds <= 0:
    return 1.0
  exp = math.floor(math.log10(seconds))
  for m in (1, 2, 5, 10):
    width = m * 10.0 ** exp
    if width >= seconds * (1 - 1e-12):
      return width
  return 10.0 ** (exp + 1)
