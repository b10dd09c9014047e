"""Columns of numpy arrays from a run's records (lists of dicts: steps, state samples), for the
metrics that summarize hundreds of thousands of them (tier stats, the binned trace and plot),
and the round bin widths those bin time by.

Reading a key from every record is most of what those metrics cost on a long run (a pass over
millions of dicts per key). A Records list keeps the columns read from it, so that the
summary, the plot and the trace of one run read each key once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from operator import itemgetter

import numpy as np


class Records(list):
  """A list of records that keeps the columns numbers() and codes() read from it; changing the
  list drops them. Its dicts must not be changed in place."""

  def __init__(self, *args):
    super().__init__(*args)
    self.columns: dict[tuple, tuple[int, object]] = {}   # key -> (length read at, value)


def _dropping_columns(name: str):
  method = getattr(list, name)

  def mutate(self, *args, **kwargs):
    self.columns.clear()
    return method(self, *args, **kwargs)
  mutate.__name__ = name
  return mutate


for _name in ("append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse",
              "__setitem__", "__delitem__", "__iadd__", "__imul__"):
  setattr(Records, _name, _dropping_columns(_name))


def _kept(records: Sequence[dict], key: tuple, read):
  """read(), or what it gave before for the same key (and length) if records is a Records."""
  if not isinstance(records, Records):
    return read()
  length, value = records.columns.get(key, (None, None))
  if length != len(records):   # (a copy of a Records shares its dict until either changes)
    value = read()
    for array in value if isinstance(value, tuple) else (value,):
      if isinstance(array, np.ndarray):
        array.flags.writeable = False   # shared by every reader
    records.columns[key] = (len(records), value)
  return value


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
  return [_kept(records, ("number", k, defaults.get(k)),
                lambda k=k: _number(records, k, defaults.get(k))) for k in keys]


def codes(records: Sequence[dict], key: str) -> tuple[np.ndarray, list[str]]:
  """(int64 array: the index of each record's value of key in names, names: the distinct
  values sorted)."""
  def read():
    values = list(map(itemgetter(key), records))
    names = sorted(set(values))
    index = {n: i for i, n in enumerate(names)}
    return np.fromiter(map(index.__getitem__, values), np.int64, len(values)), names
  return _kept(records, ("codes", key), read)


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
