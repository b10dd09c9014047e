"""The planner's workloads: a trace's lengths at Poisson rates, and each mix's length percentiles.

The planner (plain and map) offers a workload at rates it chooses, so a trace file cannot be
replayed at its own times: every rate would be the same run. A trace workload (workload.kind
azure | mooncake | burstgpt | jsonl, and the map's `workload` / `config` mix on one) is planned
from its rows' (prompt, output) length pairs instead, resampled with replacement, with Poisson
arrivals at the planned rate. TraceLengths writes those requests as a generic JSONL trace of
unit-rate Poisson arrivals (prompt_len, output_len, no ids); a run at rate r replays its first
n rows with workload.time_scale = 1 / r, which is a rate-r Poisson process. Row i is the same
whatever n (rows are drawn in blocks seeded by (seed, block)), so runs of one plan share their
first requests, as a synthetic workload's runs do. What is kept from the trace: the joint
length distribution. What is not: its arrival times, tenants, sessions and Mooncake prefix
blocks. Lengths are fitted into kv.max_model_len when the rows are replayed, as any trace's.

length_line: a mix's prompt and output length percentiles (nearest rank, so every value is a
length that occurs) as the map prints them: of the trace's rows for a trace, of LENGTH_SAMPLE
draws for a synthetic mix. Host code, no jax.
"""

from __future__ import annotations

import json
import os

import numpy as np

from pdjax.workload.from_code import read_python
from pdjax.workload.limits import fit_lengths
from pdjax.workload.traces import READERS

BLOCK = 1024              # rows drawn per seeded block
LENGTH_SAMPLE = 1000      # draws of a synthetic mix behind its printed percentiles
PERCENTILES = (50, 90, 99)
_STREAM = 0x7ace          # seed-sequence tag of the resampling draws
PRIVATE_DIR = None        # set in a planner pool's process (pool.py): its own trace files


def _state(path: str):
  try:
    st = os.stat(path)
  except OSError:
    return None
  return (st.st_mtime_ns, st.st_size, st.st_ino)


class TraceLengths:
  """A trace's (prompt, output) length pairs, offered as resampled Poisson requests."""

  def __init__(self, workload, *, seed: int, vocab_size: int, path: str):
    kind, source = workload.kind, workload.path
    if kind == "python":
      rows, _ = read_python(source, workload=workload, seed=seed, vocab_size=vocab_size)
    else:
      extra = {"vocab_size": vocab_size} if kind == "jsonl" else {}
      rows, _ = READERS[kind](source, num_requests=None, **extra)
    if not rows:
      raise ValueError(f"workload.path={source!r} holds no usable {kind} row")
    self.kind, self.source = kind, os.path.basename(source)
    self.pairs = np.array([(r.prompt_len, r.output_len) for r in rows], dtype=np.int64)
    self.seed, self.path = int(seed), path
    self._gaps = np.zeros(0)
    self._picks = np.zeros(0, dtype=np.int64)
    self._written = None     # (path, n, the file's state) of the last write

  def _draw(self, n: int) -> None:
    while len(self._gaps) < n:
      rng = np.random.default_rng([self.seed, _STREAM, len(self._gaps) // BLOCK])
      self._picks = np.concatenate([self._picks, rng.integers(0, len(self.pairs), BLOCK)])
      self._gaps = np.concatenate([self._gaps, rng.exponential(1.0, BLOCK)])

  def rows(self, n: int) -> list[dict]:
    """The first n requests: unit-rate Poisson arrivals (the first at 0) and resampled
    lengths."""
    self._draw(n)
    arrivals = np.concatenate([[0.0], np.cumsum(self._gaps[1:n])])[:n]
    return [{"arrival_s": float(t), "prompt_len": int(self.pairs[k][0]),
             "output_len": int(self.pairs[k][1])}
            for t, k in zip(arrivals, self._picks[:n])]

  def workload(self, n: int, rate: float) -> dict:
    """The workload keys of a run of n requests at `rate` req/s (writes self.path, or its
    name in PRIVATE_DIR in a pool's process)."""
    path = self.path if PRIVATE_DIR is None else os.path.join(PRIVATE_DIR,
                                                               os.path.basename(self.path))
    if self._written != (path, n, _state(path)):
      os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
      with open(path, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in self.rows(n))
      self._written = (path, n, _state(path))
    return {"kind": "jsonl", "path": path, "num_requests": int(n),
            "time_scale": 1.0 / float(rate)}

  def describe(self) -> str:
    return (f"{self.kind} trace {self.source} ({len(self.pairs)} rows): its lengths "
            f"resampled, Poisson arrivals")


def trace_lengths(cfg, mcfg, path: str) -> TraceLengths | None:
  """TraceLengths of cfg's workload when it is a trace (None when synthetic)."""
  if cfg.workload.kind == "synthetic":
    return None
  return TraceLengths(cfg.workload, seed=cfg.seed, vocab_size=mcfg.vocab_size, path=path)


def percentiles(values) -> list[int]:
  """Nearest-rank percentiles (PERCENTILES) of the values, as ints."""
  return [int(v) for v in np.percentile(np.asarray(values), PERCENTILES,
                                        method="inverted_cdf")]


def mix_lengths(cfg, mcfg, lengths: TraceLengths | None) -> tuple[str, list, list]:
  """(what the lengths are of, prompt lengths, output lengths) of cfg's workload (its mix
  applied), as the planner's runs offer them (fitted into kv.max_model_len)."""
  max_len = cfg.kv.max_model_len
  if lengths is not None:
    fitted = [fit_lengths(int(p), int(o), max_len) for p, o in lengths.pairs]
    return (f"the {len(fitted)} rows of {lengths.source}", [p for p, _ in fitted],
            [o for _, o in fitted])
  from pdjax.workload.loader import load_workload
  w = cfg.workload.copy_and_resolve_references()
  w.num_requests = LENGTH_SAMPLE
  requests, _ = load_workload(w, seed=cfg.seed, vocab_size=mcfg.vocab_size,
                              eos_ids=mcfg.eos_token_ids, max_model_len=max_len)
  return (f"{len(requests)} draws", [len(r.prompt_ids) for r in requests],
          [r.sampling.max_new_tokens for r in requests])


def length_line(of: str, prompt, output) -> str:
  """`lengths (tokens, of ...): prompt p50 374, p90 484, p99 484; output p50 44, ...`."""
  def part(values):
    return ", ".join(f"p{q} {v}" for q, v in zip(PERCENTILES, percentiles(values)))
  return f"lengths (tokens, of {of}): prompt {part(prompt)}; output {part(output)}"
