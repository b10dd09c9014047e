"""Trace rows and the problems found reading them: the shared vocabulary of trace readers.

A reader turns each good line of a trace file into a TraceRow and each bad one into a problem
line `"<file>:<line>: <what is wrong>"`; the bad line is skipped and the run goes on. Field
checks here give every reader the same messages, e.g.
  trace.csv:7: ContextTokens='abc' is not an integer
  trace.csv:8: GeneratedTokens=0 must be >= 1
  trace.jsonl:3: arrival_s=-1.0 must be >= 0
"""

from __future__ import annotations

import dataclasses
import math
import os


@dataclasses.dataclass(frozen=True)
class TraceRow:
  """One request of a trace, before token ids, id and sampling are given to it."""
  line: int                  # 1-based line in the file (messages; seeds its token ids)
  arrival_s: float           # seconds on the replay's clock (first row of a timed trace = 0)
  prompt_len: int
  output_len: int
  prompt_ids: tuple[int, ...] | None = None   # given by the trace (generic JSONL)
  hash_ids: tuple[int, ...] = ()              # shared prefix blocks (Mooncake)
  block_size: int = 0                         # tokens per hash_ids block
  tenant: str = ""
  session: str = ""
  id: str = ""                                # the trace's own id (generic JSONL); "" = none


class Problems:
  """Collects problem lines for one file; past `limit` row problems, only counts them."""

  def __init__(self, path: str, limit: int = 50):
    self.name = os.path.basename(path)
    self.limit = limit
    self.lines: list[str] = []
    self.unlisted = 0

  def row(self, line: int, what: str) -> None:
    if len(self.lines) < self.limit:
      self.lines.append(f"{self.name}:{line}: {what}")
    else:
      self.unlisted += 1

  def note(self, what: str) -> None:
    """A file-level summary line, always kept."""
    self.lines.append(f"{self.name}: {what}")

  def result(self) -> list[str]:
    if self.unlisted:
      return self.lines + [f"{self.name}: {self.unlisted} more problem rows not listed"]
    return list(self.lines)


class BadField(ValueError):
  """A field that fails its check; str() is the problem text after `<file>:<line>: `."""


def as_int(key: str, value, minimum: int) -> int:
  """value (a CSV string or a JSON value) as an int >= minimum."""
  if isinstance(value, bool) or not isinstance(value, (int, str)):
    raise BadField(f"{key}={value!r} is not an integer")
  try:
    number = int(value)
  except ValueError:
    raise BadField(f"{key}={value!r} is not an integer") from None
  if number < minimum:
    raise BadField(f"{key}={number} must be >= {minimum}")
  return number


def as_seconds(key: str, value, scale: float = 1.0) -> float:
  """value (a CSV string or a JSON number) as a finite float >= 0, times scale."""
  if isinstance(value, bool) or not isinstance(value, (int, float, str)):
    raise BadField(f"{key}={value!r} is not a number")
  try:
    number = float(value)
  except ValueError:
    raise BadField(f"{key}={value!r} is not a number") from None
  if not math.isfinite(number):
    raise BadField(f"{key}={value!r} is not a number")
  if number < 0:
    raise BadField(f"{key}={number} must be >= 0")
  return number * scale


def as_int_list(key: str, value, minimum: int = 0, below: int | None = None) -> tuple[int, ...]:
  """value (a JSON list) as ints in [minimum, below)."""
  if not isinstance(value, list):
    raise BadField(f"{key}={value!r} is not a list of integers")
  out = []
  for i, v in enumerate(value):
    number = as_int(f"{key}[{i}]", v, minimum)
    if below is not None and number >= below:
      raise BadField(f"{key}[{i}]={number} is not in [{minimum}, {below})")
    out.append(number)
  return tuple(out)


def as_str(key: str, value) -> str:
  if not isinstance(value, str):
    raise BadField(f"{key}={value!r} is not a string")
  return value


def as_id(value, seen: dict[str, int]) -> str:
  """A row's own id: a non-empty string not already taken by an earlier row (seen maps each
  kept id to its line). Results join back to the trace by it, so a duplicate is bad input."""
  value = as_str("id", value)
  if not value:
    raise BadField("id='' is empty")
  if value in seen:
    raise BadField(f"id={value!r} duplicates line {seen[value]}")
  return value


def require(record: dict, *keys: str) -> None:
  """Raises BadField naming the first key missing from a JSON record."""
  for key in keys:
    if key not in record:
      raise BadField(f"missing key {key!r}")


def start_at_zero(rows: list[TraceRow]) -> list[TraceRow]:
  """Shifts arrivals so the earliest row arrives at 0 (for traces on a wall clock)."""
  if not rows:
    return rows
  t0 = min(r.arrival_s for r in rows)
  return [dataclasses.replace(r, arrival_s=r.arrival_s - t0) for r in rows]
