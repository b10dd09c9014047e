"""A simulated instance's decode chain: many consecutive decode steps of one unchanging batch
computed at once, equal to the same steps run one by one (SimInstance.decode), bit for bit.

The scheduler (pdjax/scheduler/decode_segments.py) runs a chain where a worker's batch cannot
change before an event: it asks for the steps' end times (`chain_ends`: the cost model over
all steps at once, the context growing by one token per sequence per step), then their tokens
(`chain_tokens`: the digest chain, sequential in the steps but over the whole batch at once),
grows the block tables, and writes the pages' digests (`write_chain`) as the steps would have
left them. Pure functions over a SimInstance's state.
"""

from __future__ import annotations

import numpy as np

from pdjax.sim.digest import EMPTY, MASK, A

NUMPY_ROWS = 12   # batches at least this wide take the digest chain in numpy, narrower in Python
FIRST_CHUNK = 16  # steps timed in the first piece when the caller expects no number


def chain_ends(inst, batch: int, context_sum: int, start_s: float, max_steps: int,
               horizon_s: float, expected: int = FIRST_CHUNK) -> list[float]:
  """End times of up to max_steps decode steps of `batch` sequences, back to back from start_s
  (the first step's contexts sum to context_sum, each later one's by `batch` more), stopping
  after the first that ends at or past horizon_s. Each end is the previous plus the step's
  cost, as SimInstance.decode's pending computes it. expected: how many steps the caller
  expects (computed in one piece when right, else in doubling pieces)."""
  ends: list[float] = []
  t, first, size = start_s, 0, max(expected, 2)
  while first < max_steps:
    count = min(size, max_steps - first)
    sums = context_sum + batch * np.arange(first, first + count, dtype=np.int64)
    times = inst.cost.decode_s_steps(batch, sums)
    out = np.cumsum(np.concatenate(([t], times)))[1:]   # (sequential: t + dt0, + dt1, ...)
    cut = int(np.searchsorted(out, horizon_s, side="left"))
    if cut < count:
      ends.extend(out[:cut + 1].tolist())
      return ends
    ends.extend(out.tolist())
    t, first, size = ends[-1], first + count, 2 * size
  return ends


def chain_tokens(inst, last_tokens: list[int], positions: list[int], tables: list[list[int]],
                 steps: int, stops: list) -> tuple[list, list]:
  """The tokens (and digests) of `steps` decode steps of a batch whose row i feeds
  last_tokens[i] at positions[i] (then its own sampled token at the next position), reading
  its pages `tables[i]`. stops[i]: the token ids that end row i (empty for none). Stops after
  the first step in which some row samples one of its stop ids. Writes nothing.
  Returns (tokens, digests), per row: the steps' tokens (a list of ints) and digests."""
  ps, digests = inst.tables.page_size, inst.digests
  d = [EMPTY if p == 0 else digests[pages[(p - 1) // ps]] for p, pages in zip(positions, tables)]
  if len(d) >= NUMPY_ROWS:
    tokens, chain = _chain_numpy(inst, d, last_tokens, steps)
  else:
    tokens, chain = [], []
    for digest, token in zip(d, last_tokens):
      row_tokens, row_chain = _chain_row(inst, digest, token, steps)
      tokens.append(row_tokens)
      chain.append(row_chain)
  cut = steps
  for row, stop in zip(tokens, stops):
    if stop and not stop.isdisjoint(row[:cut]):
      cut = next(k for k, tok in enumerate(row) if tok in stop) + 1
  if cut < steps:
    tokens, chain = [row[:cut] for row in tokens], [row[:cut] for row in chain]
  return tokens, chain


def _chain_row(inst, digest: int, token: int, steps: int) -> tuple[list, list]:
  """One row's digests and tokens over the steps (SimInstance.decode's, one step at a time)."""
  span, eos = max(inst._vocab - 3, 1), inst._eos
  tokens, chain = [], []
  for _ in range(steps):
    digest = (digest * A + token + 1) & MASK
    token = 3 + digest % span
    if token in eos:
      token = inst._token(digest)
    tokens.append(token)
    chain.append(digest)
  return tokens, chain


def _chain_numpy(inst, d: list[int], last_tokens: list[int], steps: int) -> tuple[list, list]:
  """The rows' chains at once: a step at a time over the whole batch in uint64."""
  span, eos = np.uint64(max(inst._vocab - 3, 1)), inst._eos
  mask, a, one, three = np.uint64(MASK), np.uint64(A), np.uint64(1), np.uint64(3)
  eos_ids = np.array(sorted(eos), np.uint64) if eos else None
  dv, tv = np.array(d, np.uint64), np.array(last_tokens, np.uint64)
  tokens = np.empty((steps, len(d)), np.uint64)
  chain = np.empty((steps, len(d)), np.uint64)
  with np.errstate(over="ignore"):   # (uint64 wraps mod 2^64; MASK keeps the low 61 bits)
    for k in range(steps):
      dv = (dv * a + tv + one) & mask
      tv = dv % span + three
      while eos_ids is not None and np.isin(tv, eos_ids).any():   # SimInstance._token
        hit = np.isin(tv, eos_ids)
        tv[hit] = three + (tv[hit] + one) % span
      tokens[k], chain[k] = tv, dv
  return tokens.T.tolist(), chain.T.tolist()


def write_chain(inst, positions: list[int], tables: list[list[int]], chain: list) -> None:
  """Leaves each page the digest the chain's steps would have written last into it (step k of
  row i writes position positions[i] + k; chain: per row, as chain_tokens returns it): the
  digest through its last slot, or through the chain's last position for the page it ends
  in. `tables` must hold those pages."""
  ps, digests = inst.tables.page_size, inst.digests
  for p, pages, row in zip(positions, tables, chain):
    end = p + len(row) - 1
    for page_index in range(p // ps, end // ps + 1):
      digests[pages[page_index]] = row[min((page_index + 1) * ps - 1, end) - p]
