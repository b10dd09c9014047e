"""Builds the padded numpy metadata arrays that the prefill and decode programs take.

Host-only (numpy, no jax). Shapes are fixed per bucket so the programs never recompile:
prefill pads the packed tokens to a token bucket and the sequences to `max_seqs`; decode pads
the batch to a batch-size bucket. Padding tokens get an out-of-range KV slot, which the device
scatter drops, so padding never touches a real page.

An input token may be a `PendingToken(row)`: the token the previous step on the instance
sampled in that row, still on the device. Its `prev_rows` entry names the row (-1: the token
is in `tokens`), and the program takes it from the previous step's output.

A row ends with its sampling parameters: temperature, seed and, optionally, top_p (a row of
five elements samples with top_p 1.0: no nucleus filter). Every batch also carries the run's
seed (`run_seed`, int32 [1]): it is data, not a constant of the program, so one compiled
program serves every seed (repeats, sweep points) and sampling still keys by it.

`pack` flattens a batch into one int32 buffer (float32 fields bitcast), so a step moves its
metadata to the device in one transfer; the program unpacks it by the batch's static `layout`.
"""

from __future__ import annotations

import bisect
import dataclasses

import numpy as np

from pdjax.request import PendingToken


def pick_bucket(buckets: tuple[int, ...], n: int) -> int:
  """Smallest bucket >= n (buckets sorted ascending)."""
  i = bisect.bisect_left(buckets, n)
  if i == len(buckets):
    raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}")
  return buckets[i]


@dataclasses.dataclass(frozen=True)
class PageGeometry:
  num_pages: int
  page_size: int
  pages_per_seq: int   # columns of a block table: max_model_len / page_size

  @property
  def pad_slot(self) -> int:
    return self.num_pages * self.page_size   # out of range: dropped by the scatter

  def slots(self, pages: list[int], start: int, stop: int) -> np.ndarray:
    pos = np.arange(start, stop)
    return np.asarray(pages, np.int32)[pos // self.page_size] * self.page_size + pos % self.page_size

  def table(self, pages: list[int]) -> np.ndarray:
    row = np.zeros(self.pages_per_seq, np.int32)
    row[:len(pages)] = pages
    return row


def _sampling(params) -> tuple[float, int, float]:
  """(temperature, seed, top_p) from a row's trailing (temperature, seed[, top_p])."""
  temperature, seed, *rest = params
  return temperature, seed, (rest[0] if rest else 1.0)


def prefill_batch(geom: PageGeometry, seqs, *, num_tokens: int, max_seqs: int,
                  run_seed: int = 0) -> dict:
  """seqs: list of (token_ids, start, pages, temperature, seed[, top_p]): token_ids go at
  positions start.. of that sequence, whose first `start` tokens are already in the cache (a
  chunk after a cached prefix; a decode row is a one-token chunk). The program samples after
  each sequence's last token, keyed by seed and position, from its top_p nucleus (see
  pdjax.engine.sampling) and the run's seed."""
  if len(seqs) > max_seqs:
    raise ValueError(f"{len(seqs)} sequences exceed max_seqs={max_seqs}")
  total = sum(len(s[0]) for s in seqs)
  if total > num_tokens:
    raise ValueError(f"{total} tokens exceed the bucket of {num_tokens}")
  tokens = np.zeros(num_tokens, np.int32)
  prev_rows = np.full(num_tokens, -1, np.int32)
  positions = np.zeros(num_tokens, np.int32)
  slot_mapping = np.full(num_tokens, geom.pad_slot, np.int32)
  kv_lens = np.zeros(max_seqs, np.int32)
  page_indices = np.zeros((max_seqs, geom.pages_per_seq), np.int32)
  cu_q_lens = np.zeros(max_seqs + 1, np.int32)
  temperatures = np.zeros(max_seqs, np.float32)
  top_ps = np.ones(max_seqs, np.float32)
  at = 0
  seeds = np.zeros(max_seqs, np.int32)
  for i, (ids, start, pages, *sampling) in enumerate(seqs):
    n = len(ids)
    if n == 1 and isinstance(ids[0], PendingToken):
      prev_rows[at] = ids[0].row
    else:
      tokens[at:at + n] = ids
    positions[at:at + n] = np.arange(start, start + n)
    slot_mapping[at:at + n] = geom.slots(pages, start, start + n)
    kv_lens[i] = start + n
    page_indices[i] = geom.table(pages)
    temperatures[i], seeds[i], top_ps[i] = _sampling(sampling)
    at += n
    cu_q_lens[i + 1] = at
  cu_q_lens[len(seqs) + 1:] = at
  return dict(tokens=tokens, prev_rows=prev_rows, positions=positions,
              slot_mapping=slot_mapping, kv_lens=kv_lens, page_indices=page_indices,
              cu_q_lens=cu_q_lens, num_seqs=np.array([len(seqs)], np.int32),
              temperatures=temperatures, top_ps=top_ps, seeds=seeds,
              run_seed=np.array([run_seed], np.int32))


def decode_batch(geom: PageGeometry, seqs, *, batch_size: int, run_seed: int = 0) -> dict:
  """seqs: list of (last_token, position, pages, temperature, seed[, top_p]); position = where
  it goes; seed = the request's sampling seed (Request.sampling_seed); top_p: its nucleus
  (default 1.0)."""
  if len(seqs) > batch_size:
    raise ValueError(f"{len(seqs)} sequences exceed the batch bucket {batch_size}")
  tokens = np.zeros(batch_size, np.int32)
  prev_rows = np.full(batch_size, -1, np.int32)
  positions = np.zeros(batch_size, np.int32)
  slot_mapping = np.full(batch_size, geom.pad_slot, np.int32)
  lengths = np.ones(batch_size, np.int32)
  page_indices = np.zeros((batch_size, geom.pages_per_seq), np.int32)
  temperatures = np.zeros(batch_size, np.float32)
  top_ps = np.ones(batch_size, np.float32)
  seeds = np.zeros(batch_size, np.int32)
  for i, (token, pos, pages, *sampling) in enumerate(seqs):
    if isinstance(token, PendingToken):
      prev_rows[i] = token.row
    else:
      tokens[i] = token
    positions[i] = pos
    slot_mapping[i] = geom.slots(pages, pos, pos + 1)[0]
    lengths[i] = pos + 1
    page_indices[i] = geom.table(pages)
    temperatures[i], seeds[i], top_ps[i] = _sampling(sampling)
  return dict(tokens=tokens, prev_rows=prev_rows, positions=positions,
              slot_mapping=slot_mapping, lengths=lengths, page_indices=page_indices,
              temperatures=temperatures, top_ps=top_ps, seeds=seeds,
              run_seed=np.array([run_seed], np.int32))


def padding_batch(kind: str, geom: PageGeometry, n: int, max_prefill_seqs: int) -> dict:
  """An all-padding batch of bucket n ("prefill": n tokens, max_prefill_seqs sequences;
  "decode": n sequences): it writes no page. Its `layout` is the bucket's."""
  if kind == "prefill":
    return prefill_batch(geom, [], num_tokens=n, max_seqs=max_prefill_seqs)
  return decode_batch(geom, [], batch_size=n)


def layout(batch: dict) -> tuple[tuple[str, tuple[int, ...], str], ...]:
  """The static description `pack` flattens by: (name, shape, dtype) per field, in order."""
  return tuple((k, v.shape, v.dtype.name) for k, v in batch.items())


def pack(batch: dict) -> np.ndarray:
  """One int32 buffer holding every field of the batch (float32 fields bitcast), in `layout`
  order."""
  return np.concatenate([np.ascontiguousarray(v).view(np.int32).ravel()
                         for v in batch.values()])


def page_id_batch(geom: PageGeometry, pages: list[int], bucket: int, *, pad_with_drop: bool):
  """Pads a page list to a bucket: gathers repeat page 0, scatters use out-of-range ids."""
  ids = np.full(bucket, geom.num_pages if pad_with_drop else 0, np.int32)
  ids[:len(pages)] = pages
  return ids
