"""A run's records (step records, state samples) kept as numpy columns, not one dict each.

A long simulated run records millions of steps and samples; as dicts they cost ~1 KB each and
every metric that reads one key reads millions of scattered dicts. A RecordTable keeps one
column per field (float64, int64, bool, or an int32 code into the field's names for strings),
grown by doubling. Rows are added as tuples in field order (`add`, buffered and written to
the columns in blocks by `flush_if_full`, which the owner calls now and then, or at any read) or as whole columns (`extend`: a decode segment's steps at once). The
metrics read the columns (`column`, `codes`, through metrics/columns.py); anything else sees
a sequence of dicts equal to the ones the producers used to append (iteration, indexing),
built on demand. An optional field (None in a row) is absent from that row's dict.

Host logic (numpy only), single-threaded like the driver that appends to it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np

BLOCK = 4096   # rows buffered as tuples before they are written to the columns

_DTYPES = {"float": np.float64, "int": np.int64, "bool": np.bool_, "str": np.int32}


@dataclasses.dataclass(frozen=True)
class Field:
  name: str
  kind: str                # float, int, bool or str
  optional: bool = False   # may be absent (None in a row; NaN in its float64 column)

  def __post_init__(self):
    if self.kind not in _DTYPES:
      raise ValueError(f"field {self.name}: kind must be one of {sorted(_DTYPES)}, "
                       f"got {self.kind!r}")
    if self.optional and self.kind not in ("float", "int"):
      raise ValueError(f"field {self.name}: only numeric fields may be optional")


class _Names(dict):
  """name -> code for a str field, codes given in order of first appearance."""

  def __init__(self):
    super().__init__()
    self.names: list[str] = []

  def __missing__(self, name: str) -> int:
    if not isinstance(name, str):
      raise TypeError(f"a str field got {name!r}")
    code = self[name] = len(self.names)
    self.names.append(name)
    return code


class RecordTable:

  def __init__(self, fields: Sequence[Field], names: dict[str, _Names] | None = None):
    """names: the str fields' code books, shared with another table (`empty_like`)."""
    self.fields = tuple(fields)
    self.index = {f.name: i for i, f in enumerate(self.fields)}
    if len(self.index) != len(self.fields):
      raise ValueError("duplicate field names")
    self._names = names if names is not None else {
        f.name: _Names() for f in self.fields if f.kind == "str"}
    self._columns = [np.empty(BLOCK, _storage(f)) for f in self.fields]
    self._n = 0                        # rows in the columns
    self._rows: list[tuple] = []       # rows added since, not written yet
    self.add = self._rows.append       # a row (producers call it per step: list.append, in C;
                                       # the owner calls flush_if_full now and then)

  def empty_like(self) -> "RecordTable":
    """An empty table of the same fields sharing this one's code books."""
    return RecordTable(self.fields, self._names)

  # ---- adding -----------------------------------------------------------------------------

  def flush_if_full(self) -> None:
    """Writes the buffered rows to the columns once there are BLOCK of them."""
    if len(self._rows) >= BLOCK:
      self.flush()

  def append(self, record: dict) -> None:
    """Adds one record given as a dict (its fields; an optional one may be missing)."""
    extra = set(record) - set(self.index)
    if extra:
      raise KeyError(f"fields not in this table: {sorted(extra)}")
    self.add(tuple(record[f.name] if not f.optional else record.get(f.name)
                   for f in self.fields))
    self.flush_if_full()

  def flush(self) -> None:
    """Writes the buffered rows to the columns."""
    rows = self._rows
    if not rows:
      return
    n = len(rows)
    self._reserve(n)
    for f, column, values in zip(self.fields, self._columns, zip(*rows)):
      if f.kind == "str":
        values = map(self._names[f.name].__getitem__, values)
      elif f.optional:
        values = (np.nan if v is None else v for v in values)
      column[self._n:self._n + n] = np.fromiter(values, column.dtype, n)
    self._n += n
    rows.clear()   # (the same list: `add` is its append)

  def extend(self, n: int, values: dict) -> None:
    """Adds n rows given by column: values[name] is a sequence of n values or one value for
    all (a str field's: one name, or an int array of codes from `code`); every field must be
    given (None: an optional one absent)."""
    if set(values) != set(self.index):
      raise KeyError(f"extend needs exactly the fields {sorted(self.index)}, got "
                     f"{sorted(values)}")
    self.flush()
    self._reserve(n)
    for f, column in zip(self.fields, self._columns):
      v = values[f.name]
      if f.kind == "str":
        v = v if isinstance(v, np.ndarray) else self._names[f.name][v]
      elif v is None:
        v = np.nan
      column[self._n:self._n + n] = v
    self._n += n

  def _reserve(self, n: int) -> None:
    need = self._n + n
    if need <= len(self._columns[0]):
      return
    size = len(self._columns[0])
    while size < need:
      size *= 2
    for i, column in enumerate(self._columns):
      grown = np.empty(size, column.dtype)
      grown[:self._n] = column[:self._n]
      self._columns[i] = grown

  def truncate(self, n: int) -> None:
    """Drops the rows from n on."""
    self.flush()
    if not 0 <= n <= self._n:
      raise IndexError(f"cannot truncate {self._n} rows to {n}")
    self._n = n

  def take_from(self, start: int, order: np.ndarray, tail: "RecordTable") -> None:
    """Replaces the rows from start on with those rows followed by tail's (a table sharing
    this one's code books), reordered by order (indices into that concatenation)."""
    self.flush()
    tail.flush()
    if tail._names is not self._names:
      raise ValueError("tail must share this table's code books (empty_like)")
    n = self._n - start + tail._n
    if len(order) != n:
      raise ValueError(f"order has {len(order)} indices for {n} rows")
    self._reserve(tail._n)
    for column, other in zip(self._columns, tail._columns):
      both = np.concatenate([column[start:self._n], other[:tail._n]])
      column[start:start + n] = both[order]
    self._n = start + n

  # ---- reading ----------------------------------------------------------------------------

  def __len__(self) -> int:
    return self._n + len(self._rows)

  def __bool__(self) -> bool:
    return len(self) > 0

  def column(self, name: str) -> np.ndarray:
    """The field's values, one per row (a read-only view; a str field's codes: see codes()).
    An optional field's absent values are NaN."""
    self.flush()
    view = self._columns[self.index[name]][:self._n]
    view.flags.writeable = False
    return view

  def code(self, name: str, value: str) -> int:
    """A str field's code for value (given one if new)."""
    return self._names[name][value]

  def names(self, name: str) -> list[str]:
    """A str field's names, in code order (first appearance in this table or its siblings)."""
    return list(self._names[name].names)

  def has(self, name: str) -> bool:
    """Whether every row has the field (an optional field: whether any row lacks it is read
    from its column)."""
    if name not in self.index:
      return False
    f = self.fields[self.index[name]]
    return not f.optional or not np.isnan(self.column(name)).any()

  def last_row(self) -> tuple:
    """The newest row as a tuple in field order (str fields as names, absent as None)."""
    if self._rows:
      return self._rows[-1]
    if not self._n:
      raise IndexError("the table is empty")
    return next(self._tuples(self._n - 1, self._n))

  def _tuples(self, start: int, stop: int) -> Iterator[tuple]:
    lists = []
    for f, column in zip(self.fields, self._columns):
      values = column[start:stop].tolist()
      if f.kind == "str":
        names = self._names[f.name].names
        values = [names[c] for c in values]
      elif f.optional:
        values = [None if v != v else (int(v) if f.kind == "int" else v) for v in values]
      lists.append(values)
    return zip(*lists)

  def _dict(self, row: tuple) -> dict:
    return {f.name: v for f, v in zip(self.fields, row) if v is not None or not f.optional}

  def __iter__(self) -> Iterator[dict]:
    self.flush()
    n, step = self._n, BLOCK
    for start in range(0, n, step):
      for row in self._tuples(start, min(start + step, n)):
        yield self._dict(row)

  def __getitem__(self, i):
    self.flush()
    if isinstance(i, slice):
      start, stop, stride = i.indices(self._n)
      if stride != 1:
        return list(self)[i]
      return [self._dict(row) for row in self._tuples(start, max(stop, start))]
    if i < 0:
      i += self._n
    if not 0 <= i < self._n:
      raise IndexError(f"index {i} out of range for {self._n} records")
    return self._dict(next(self._tuples(i, i + 1)))

  def __eq__(self, other) -> bool:
    if isinstance(other, (RecordTable, list, tuple)):
      return len(self) == len(other) and list(self) == list(other)
    return NotImplemented

  __hash__ = None

  def __repr__(self) -> str:
    return f"RecordTable({len(self)} rows: {', '.join(f.name for f in self.fields)})"


def _storage(f: Field):
  return np.float64 if f.optional else _DTYPES[f.kind]
