"""Workloads from the researcher's own code: `workload.kind = "python"` with
`workload.path = "module:function"`.

The function is called as `function(config, rng)`: `config` is the workload section of the
config (read any key of it, e.g. `config.num_requests`, `config.rate`) and `rng` a
`numpy.random.Generator` seeded from the run's seed, so a run is reproducible. It returns (or
yields) rows with the fields of a generic JSONL trace row: `arrival_s`, `prompt_len` or
`prompt_ids`, `output_len`, optional `id`, `session`, `tenant`. Rows are checked exactly as
trace rows are: a bad row becomes one problem line naming it (`my_mod:gen row 3: arrival_s=-1.0
must be >= 0`) and is skipped; the run goes on. numpy numbers and arrays are taken as Python
ones. Rows arrive at their own `arrival_s` (times `workload.time_scale`), not shifted to 0.
"""

from __future__ import annotations

import inspect

import numpy as np

from pdjax.import_path import import_attr
from pdjax.workload.trace_rows import BadField, Problems, TraceRow
from pdjax.workload.traces import jsonl_row


class _RowProblems(Problems):
  """Problem lines `<module:function> row <n>: ...` (a row has no file line)."""

  def row(self, line: int, what: str) -> None:
    if len(self.lines) < self.limit:
      self.lines.append(f"{self.name} row {line}: {what}")
    else:
      self.unlisted += 1


def workload_function(path: str):
  """The function `workload.path` names; ValueError (one line) when it cannot be used."""
  fn = import_attr("workload.path", path)
  if not callable(fn):
    raise ValueError(f"workload.path={path!r} is a {type(fn).__name__}, not a function")
  try:
    inspect.signature(fn).bind(None, None)
  except TypeError:
    raise ValueError(f"workload.path={path!r}: {path.partition(':')[2]} must take "
                     "(config, rng)") from None
  except ValueError:   # no signature to inspect (a builtin): let the call decide
    pass
  return fn


def _plain(value):
  """numpy scalars and arrays (and tuples) as the JSON values a trace row holds."""
  if isinstance(value, np.generic):
    return value.item()
  if isinstance(value, (np.ndarray, tuple)):
    return [_plain(v) for v in value]
  return value


def read_python(path: str, *, workload, seed: int, num_requests: int | None = None,
                vocab_size: int | None = None) -> tuple[list[TraceRow], list[str]]:
  """The rows `path`'s function returns for this workload config and seed, and the problem
  lines of the rows skipped (first `num_requests` good rows; None: all)."""
  fn = workload_function(path)
  rows_out = fn(workload, np.random.default_rng(seed))
  try:
    rows_in = iter(rows_out)
  except TypeError:
    raise ValueError(f"workload.path={path!r} returned {type(rows_out).__name__}, not an "
                     "iterable of rows") from None
  problems, rows, seen = _RowProblems(path), [], {}
  for n, rec in enumerate(rows_in, start=1):
    if not isinstance(rec, dict):
      problems.row(n, f"expected a dict of trace-row fields, got {type(rec).__name__}")
      continue
    try:
      rows.append(jsonl_row(n, {k: _plain(v) for k, v in rec.items()}, seen, vocab_size))
    except BadField as e:
      problems.row(n, str(e))
    if num_requests is not None and len(rows) >= num_requests:
      break
  return rows, problems.result()
