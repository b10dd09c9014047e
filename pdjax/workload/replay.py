"""Trace replay: TraceRows to Requests through a grain pipeline.

The per-row work (token ids, fitting into max_model_len, the Request itself) is a grain
`MapDataset` pipeline over chunks of rows (`ChunkToRequests` applying `RowToRequest` to each
row), so later work can shard or prefetch large traces without changing the transform. Rows are sorted by arrival first (ties
keep file order); a row keeps its own id when it has one (generic JSONL), the others get
req-00000.. by their place in that order (skipping any name a row's own id took). time_scale
multiplies every gap from the first arrival (0.5 replays twice as fast). A row without prompt
ids gets ids seeded by (seed, its line), or its Mooncake blocks: the same trace and seed give
the same requests.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pdjax.request import Request, SamplingParams
from pdjax.workload.limits import check_max_model_len, fit_lengths, truncation_note
from pdjax.workload.tokens import allowed_token_ids, block_prompt, random_prompt
from pdjax.workload.trace_rows import TraceRow

_ROW_STREAM = 0   # seed-sequence tag for per-row prompt ids (blocks use tokens._BLOCK_STREAM)


@dataclasses.dataclass(frozen=True)
class RowToRequest:
  """The grain map transform: (index, row) -> Request."""
  seed: int
  allowed: np.ndarray
  max_model_len: int
  temperature: float
  eos_ids: tuple[int, ...]
  ignore_eos: bool
  taken: frozenset[str] = frozenset()   # the rows' own ids: generated ids avoid them

  def request_id(self, index: int, row: TraceRow) -> str:
    """The row's own id, else req-<index>; a generated id some row owns gets a .<n> suffix."""
    if row.id:
      return row.id
    name, n = f"req-{index:05d}", 0
    while (f"{name}.{n}" if n else name) in self.taken:
      n += 1
    return f"{name}.{n}" if n else name

  def prompt_ids(self, row: TraceRow) -> list[int]:
    if row.prompt_ids is not None:
      return list(row.prompt_ids)
    rng = np.random.default_rng([self.seed, _ROW_STREAM, row.line])
    if row.hash_ids:
      return block_prompt(row.hash_ids, row.prompt_len, row.block_size, seed=self.seed,
                          allowed=self.allowed, rng=rng)
    return random_prompt(rng, self.allowed, row.prompt_len)

  def __call__(self, index: int, row: TraceRow) -> Request:
    prompt_len, output_len = fit_lengths(row.prompt_len, row.output_len, self.max_model_len)
    row = dataclasses.replace(row, prompt_len=prompt_len)
    return Request(
        id=self.request_id(index, row), arrival_s=float(row.arrival_s),
        prompt_ids=self.prompt_ids(row)[:prompt_len],
        sampling=SamplingParams(temperature=self.temperature, max_new_tokens=output_len,
                                ignore_eos=self.ignore_eos),
        eos_ids=self.eos_ids, tenant=row.tenant, session=row.session)


CHUNK_ROWS = 1024   # rows per grain element


@dataclasses.dataclass(frozen=True)
class ChunkToRequests:
  """The grain map transform over chunks: first row index -> that chunk's Requests."""
  rows: list
  to_request: RowToRequest

  def __call__(self, start: int) -> list[Request]:
    end = min(start + CHUNK_ROWS, len(self.rows))
    return [self.to_request(i, self.rows[i]) for i in range(start, end)]


def scale_time(rows: list[TraceRow], time_scale: float) -> list[TraceRow]:
  """rows sorted by arrival, each gap from the first arrival multiplied by time_scale."""
  if not (time_scale > 0 and np.isfinite(time_scale)):
    raise ValueError(f"time_scale must be a finite number > 0, got {time_scale}")
  rows = sorted(rows, key=lambda r: r.arrival_s)
  if not rows:
    return rows
  t0 = rows[0].arrival_s
  return [dataclasses.replace(r, arrival_s=t0 + (r.arrival_s - t0) * time_scale)
          for r in rows]


def replay(rows: list[TraceRow], *, source: str, seed: int, vocab_size: int,
           eos_ids: tuple[int, ...], max_model_len: int, time_scale: float = 1.0,
           temperature: float = 0.0,
           ignore_eos: bool = False) -> tuple[list[Request], list[str]]:
  """Requests sorted by arrival and the problems (one line if any were truncated)."""
  import grain  # Imported here: grain pulls in jax, which the rest of the workload avoids.

  check_max_model_len(max_model_len)
  rows = scale_time(rows, time_scale)
  to_request = RowToRequest(seed=int(seed), allowed=allowed_token_ids(vocab_size, eos_ids),
                            max_model_len=max_model_len, temperature=temperature,
                            eos_ids=tuple(int(e) for e in eos_ids), ignore_eos=ignore_eos,
                            taken=frozenset(r.id for r in rows if r.id))
  # grain's per-element bookkeeping (statistics, byte estimates; when iterated, a prefetch
  # buffer scanned per element) cost more than the transform itself on hour-long traces
  # (~24 s of a 19,366-row trace's load): elements are chunks of rows, read by index.
  dataset = grain.MapDataset.source(range(0, len(rows), CHUNK_ROWS)).map(
      ChunkToRequests(rows, to_request))
  requests = [req for i in range(len(dataset)) for req in dataset[i]]
  truncated = sum(fit_lengths(r.prompt_len, r.output_len, max_model_len)
                  != (r.prompt_len, r.output_len) for r in rows)
  problems = [truncation_note(source, truncated, len(rows), max_model_len)] if truncated else []
  return requests, problems
