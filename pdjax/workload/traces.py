"""Trace file readers: a local file in, TraceRows and problem lines out.

Each reader parses one published format; bad lines become problems (see trace_rows) and are
skipped. `num_requests` keeps the first N good rows of the file (None: all). Arrivals of the
timed formats start at 0 on the first (earliest) row; the generic JSONL keeps its arrival_s.
  azure     Azure LLM inference trace CSV: TIMESTAMP (datetime such as
            2023-11-16 18:15:46.6805900), ContextTokens, GeneratedTokens.
  mooncake  Mooncake JSONL: timestamp (ms), input_length, output_length, hash_ids (ids of
            512-token prefix blocks; requests naming the same id share that block's tokens).
            block_size < 512 scales prompt lengths by block_size / 512, keeping the sharing
            pattern at a smaller context.
  burstgpt  BurstGPT CSV: Timestamp (s), Model, Request tokens, Response tokens, Total tokens,
            Log Type. Rows with 0 response tokens are failed requests: skipped, counted in one
            summary problem. Model becomes the request's tenant.
  jsonl     generic JSONL: arrival_s, prompt_ids (ids in [0, vocab_size)) or prompt_len,
            output_len, optional id, tenant and session (strings). A row's id becomes its
            request's id (results join back to the trace); a repeated id is a problem and
            that later row is skipped.
"""

from __future__ import annotations

import csv
import datetime
import json
import math
from collections.abc import Callable, Iterator

from pdjax.workload.trace_rows import (BadField, Problems, TraceRow, as_id, as_int,
                                       as_int_list, as_seconds, as_str, require, start_at_zero)

MOONCAKE_BLOCK = 512   # tokens per hash_ids block in the Mooncake traces
Reader = Callable[..., tuple[list[TraceRow], list[str]]]


def _full(rows: list, num_requests: int | None) -> bool:
  return num_requests is not None and len(rows) >= num_requests


def _csv_records(path: str, columns: tuple[str, ...],
                 problems: Problems) -> Iterator[tuple[int, dict[str, str]]]:
  """(line, {column: raw}) per data line; a header without the columns yields nothing."""
  with open(path, newline="") as f:
    reader = csv.reader(f)
    header = [h.strip() for h in next(reader, [])]
    missing = [c for c in columns if c not in header]
    if missing:
      problems.row(1, f"header {','.join(header)!r} lacks column(s) {missing}")
      return
    for values in reader:
      if not values or values == [""]:
        continue
      if len(values) != len(header):
        problems.row(reader.line_num,
                     f"expected {len(header)} columns ({','.join(header)}), got {len(values)}")
        continue
      yield reader.line_num, {h: v.strip() for h, v in zip(header, values)}


def _json_records(path: str, problems: Problems) -> Iterator[tuple[int, dict]]:
  """(line, object) per non-blank line that is a JSON object."""
  with open(path) as f:
    for line, text in enumerate(f, start=1):
      if not text.strip():
        continue
      try:
        record = json.loads(text.strip())
      except json.JSONDecodeError as e:
        problems.row(line, f"bad JSON ({e.msg} at column {e.colno})")
        continue
      if not isinstance(record, dict):
        problems.row(line, f"expected a JSON object, got {type(record).__name__}")
        continue
      yield line, record


def _azure_time(raw: str) -> datetime.datetime:
  try:
    t = datetime.datetime.fromisoformat(raw)
  except ValueError:
    raise BadField(f"TIMESTAMP={raw!r} is not a datetime like "
                   "'2023-11-16 18:15:46.6805900'") from None
  return t if t.tzinfo else t.replace(tzinfo=datetime.timezone.utc)


def read_azure(path: str, *, num_requests: int | None = None) -> tuple[list[TraceRow], list[str]]:
  problems, rows, t0 = Problems(path), [], None
  for line, rec in _csv_records(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
                                problems):
    try:
      t = _azure_time(rec["TIMESTAMP"])
      t0 = t0 or t   # Differences of datetimes keep the microseconds that epoch floats lose.
      rows.append(TraceRow(line=line, arrival_s=(t - t0).total_seconds(),
                           prompt_len=as_int("ContextTokens", rec["ContextTokens"], 1),
                           output_len=as_int("GeneratedTokens", rec["GeneratedTokens"], 1)))
    except BadField as e:
      problems.row(line, str(e))
    if _full(rows, num_requests):
      break
  return start_at_zero(rows), problems.result()


def read_burstgpt(path: str, *,
                  num_requests: int | None = None) -> tuple[list[TraceRow], list[str]]:
  problems, rows, failed = Problems(path), [], 0
  columns = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens",
             "Log Type")
  for line, rec in _csv_records(path, columns, problems):
    try:
      arrival = as_seconds("Timestamp", rec["Timestamp"])
      prompt_len = as_int("Request tokens", rec["Request tokens"], 1)
      output_len = as_int("Response tokens", rec["Response tokens"], 0)
    except BadField as e:
      problems.row(line, str(e))
      continue
    if output_len == 0:
      failed += 1
      continue
    rows.append(TraceRow(line=line, arrival_s=arrival, prompt_len=prompt_len,
                         output_len=output_len, tenant=rec["Model"]))
    if _full(rows, num_requests):
      break
  if failed:
    problems.note(f"skipped {failed} rows with 0 response tokens")
  return start_at_zero(rows), problems.result()


def read_mooncake(path: str, *, num_requests: int | None = None,
                  block_size: int = MOONCAKE_BLOCK) -> tuple[list[TraceRow], list[str]]:
  if not 1 <= block_size <= MOONCAKE_BLOCK:
    raise ValueError(f"block_size must be in [1, {MOONCAKE_BLOCK}], got {block_size}")
  problems, rows = Problems(path), []
  for line, rec in _json_records(path, problems):
    try:
      require(rec, "timestamp", "input_length", "output_length")
      input_len = as_int("input_length", rec["input_length"], 1)
      rows.append(TraceRow(
          line=line, arrival_s=as_seconds("timestamp", rec["timestamp"], 1e-3),
          prompt_len=max(1, math.ceil(input_len * block_size / MOONCAKE_BLOCK)),
          output_len=as_int("output_length", rec["output_length"], 1),
          hash_ids=as_int_list("hash_ids", rec.get("hash_ids", [])), block_size=block_size))
    except BadField as e:
      problems.row(line, str(e))
    if _full(rows, num_requests):
      break
  return start_at_zero(rows), problems.result()


def jsonl_row(line: int, rec: dict, seen: dict[str, int],
              vocab_size: int | None = None) -> TraceRow:
  """One generic JSONL record as a TraceRow (seen: the ids kept so far -> their lines);
  BadField names what is wrong with it."""
  require(rec, "arrival_s", "output_len")
  row_id = as_id(rec["id"], seen) if "id" in rec else ""
  if "prompt_ids" in rec:
    prompt_ids = as_int_list("prompt_ids", rec["prompt_ids"], 0, vocab_size)
    if not prompt_ids:
      raise BadField("prompt_ids=[] is empty")
    prompt_len = len(prompt_ids)
  elif "prompt_len" in rec:
    prompt_ids, prompt_len = None, as_int("prompt_len", rec["prompt_len"], 1)
  else:
    raise BadField("missing key 'prompt_ids' or 'prompt_len'")
  row = TraceRow(
      line=line, arrival_s=as_seconds("arrival_s", rec["arrival_s"]),
      prompt_len=prompt_len, output_len=as_int("output_len", rec["output_len"], 1),
      prompt_ids=prompt_ids, tenant=as_str("tenant", rec.get("tenant", "")),
      session=as_str("session", rec.get("session", "")), id=row_id)
  if row_id:
    seen[row_id] = line
  return row


def read_jsonl(path: str, *, num_requests: int | None = None,
               vocab_size: int | None = None) -> tuple[list[TraceRow], list[str]]:
  problems, rows, seen = Problems(path), [], {}
  for line, rec in _json_records(path, problems):
    try:
      rows.append(jsonl_row(line, rec, seen, vocab_size))
    except BadField as e:
      problems.row(line, str(e))
    if _full(rows, num_requests):
      break
  return rows, problems.result()


READERS: dict[str, Reader] = {
    "azure": read_azure, "mooncake": read_mooncake, "burstgpt": read_burstgpt,
    "jsonl": read_jsonl,
}
