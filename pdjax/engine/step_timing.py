"""Measures the real engine's step times, KV transfers, host sharing and the driver's host time
per step: the points `pdjax.sim.calibrated` fits into the simulator's calibrated cost model
(pdjax/runner/calibration.py `calibrate` puts them into the whole profile; `pdjax.calibrate` is
the command that writes it).

It lives in the engine, not in pdjax/sim/, because it times real instances on devices (jax,
engine.cluster, engine.transfer); the simulator's side, the fits and the profile's format, stay
in the jax-free `pdjax.sim.calibrated`. Builds the config's disaggregated cluster (or, when it
does not fit the devices, one prefill and one decode instance; plus a colocated one when its TP
differs), then times, per TP degree, a grid of prefill steps (each token bucket half and fully
used, as one sequence, as several, and after a cached prefix), decode steps (each batch bucket
half and full, at short, middle and full contexts) and KV transfers (every transfer bucket), and
how instances that share the host slow each other (`measure_sharing`); prefill steps also in a
chunked run's ragged program (a row per decode: more rows, slower small steps) when it differs.
A point is the median of at least `repeats` runs (and MIN_POINT_S) from dispatch to result,
as the driver sees a step; the whole grid is measured `rounds` times, spread in time, and each
point keeps its median over the rounds. (The driver's per-step host time, which serving a
workload through the scheduler measures, is the runner's: pdjax/runner/calibration.py.)
"""

from __future__ import annotations

import statistics
import time

MIN_POINT_S = 0.05


def _median_s(call, repeats: int) -> float:
  times = []
  while len(times) < repeats or sum(times) < MIN_POINT_S:
    start = time.perf_counter()
    call()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def _median_rounds(rounds: list):
  """Elementwise median of equally shaped nests (dicts, lists) over the rounds; leaves that
  every round shares (grid coordinates) come out unchanged."""
  first = rounds[0]
  if isinstance(first, dict):
    return {k: _median_rounds([r[k] for r in rounds]) for k in first}
  if isinstance(first, (list, tuple)):
    return type(first)(_median_rounds([r[i] for r in rounds]) for i in range(len(first)))
  return statistics.median(rounds) if len(set(rounds)) > 1 else first


def prefill_grid(opts) -> list[list[tuple[int, int]]]:
  """Steps as (new tokens q, cached tokens c) per sequence, within the engine's limits."""
  limit = opts.max_model_len - 1
  steps = []
  for bucket in opts.prefill_buckets:
    for n in sorted({bucket // 2 + 1, bucket}):
      if n <= limit:
        steps.append([(n, 0)])
      k = min(opts.max_prefill_seqs, 4)
      if n // k >= 1:
        steps.append([(n // k, 0)] * k)
      if n // 2 + min(256, limit - n // 2) <= limit:
        steps.append([(n // 2, min(256, limit - n // 2))])
  return steps


def decode_grid(opts) -> list[list[int]]:
  """Contexts per decode step; the longest context at a batch size is the one whose pages fit
  the pool."""
  steps = []
  for bucket in opts.decode_buckets:
    for batch in sorted({bucket // 2 + 1, bucket}):
      fits = (opts.num_pages // batch) * opts.page_size - 1
      for ctx in sorted({16, opts.max_model_len // 2, opts.max_model_len - 1}):
        steps.append([min(ctx, fits)] * batch)
  return [list(s) for s in dict.fromkeys(tuple(s) for s in steps)]


def _with_pages(inst, lengths: list[int], fn):
  ids = [f"calib-{i}" for i in range(len(lengths))]
  tables = [inst.tables.allocate(i, n) for i, n in zip(ids, lengths)]
  try:
    return fn(tables)
  finally:
    for i in ids:
      inst.tables.free(i)


def measure_points(inst, opts, repeats: int, vocab: int,
                   kinds: tuple[str, ...] = ("prefill", "decode")) -> dict:
  """One pass over the step grid: {"prefill": [points], "decode": [points]} (the kinds
  asked)."""
  from pdjax.sim.calibrated import attention_pairs
  from pdjax.engine.batch import pick_bucket
  points = {k: [] for k in kinds}
  for chunks in prefill_grid(opts) if "prefill" in kinds else ():
    def step(tables, chunks=chunks):
      seqs = [([3 + (7 * j) % (vocab - 3) for j in range(q)], c, t, 0.0, 0)
              for (q, c), t in zip(chunks, tables)]
      return _median_s(lambda: inst.prefill(seqs).result(), repeats)
    seconds = _with_pages(inst, [q + c for q, c in chunks], step)
    padded = pick_bucket(opts.prefill_buckets, sum(q for q, _ in chunks))
    points["prefill"].append({"chunks": chunks, "x": [padded, attention_pairs(chunks)],
                              "seconds": seconds})
  for contexts in decode_grid(opts) if "decode" in kinds else ():
    def step(tables, contexts=contexts):
      seqs = [(5, ctx - 1, t, 0.0, 0) for ctx, t in zip(contexts, tables)]
      return _median_s(lambda: inst.decode(seqs).result(), repeats)
    seconds = _with_pages(inst, contexts, step)
    padded = pick_bucket(opts.decode_buckets, len(contexts))
    points["decode"].append({"contexts": [contexts[0], len(contexts)],
                             "x": [padded, sum(contexts)], "seconds": seconds})
  return points


def fit_points(points: dict) -> dict:
  from pdjax.sim.calibrated import fit_step
  out = {}
  for kind in ("prefill", "decode"):
    fit, err = fit_step([(*p["x"], p["seconds"]) for p in points[kind]])
    out[kind] = fit.to_json()
    out.setdefault("mean_rel_error", {})[kind] = round(err, 4)
  out["points"] = points
  return out


def measure_sharing(instances, opts, repeats: int) -> dict:
  """How instances sharing a host slow each other: the duration of one step (a middle prefill
  bucket; a half-full decode batch at half the context) on instance 0 while n_p other
  instances keep running prefill steps and n_d others decode steps (re-dispatched as they end,
  like the driver), over its duration alone. Returns {"prefill": table, "decode": table} with
  table[n_p][n_d]. ~1.0 everywhere when each instance has chips of its own."""
  from pdjax.engine.batch import pick_bucket
  bucket = opts.prefill_buckets[len(opts.prefill_buckets) // 2]
  batch = pick_bucket(opts.decode_buckets, max(1, opts.decode_buckets[-1] // 2))
  ctx = min(opts.max_model_len // 2, (opts.num_pages // batch) * opts.page_size - 1)

  def caller(inst, kind, tables):
    if kind == "prefill":
      return lambda: inst.prefill([([7] * bucket, 0, tables[0], 0.0, 0)])
    return lambda: inst.decode([(5, ctx - 1, t, 0.0, 0) for t in tables])

  def timed(group):   # group: [(instance, kind, tables)]; the first is the subject
    calls = [caller(*g) for g in group]
    durations = []
    for _ in range(repeats):
      background = [c() for c in calls[1:]]
      start = time.perf_counter()
      subject = calls[0]()
      while not subject.ready():
        for i, pending in enumerate(background):
          if pending.ready():
            pending.result()
            background[i] = calls[i + 1]()
        time.sleep(0.0002)
      durations.append(time.perf_counter() - start)
      subject.result()
      for pending in background:
        pending.result()
    return statistics.median(durations)

  others = len(instances) - 1
  tables = {}
  for kind in ("prefill", "decode"):
    rows = []
    for n_p in range(others + 1):
      row = []
      for n_d in range(others + 1 - n_p):
        kinds = [kind] + ["prefill"] * n_p + ["decode"] * n_d
        lengths = {"prefill": [bucket], "decode": [ctx] * batch}
        seconds = _with_pages_each(instances[:len(kinds)], [lengths[k] for k in kinds],
                                   lambda t, kinds=kinds: timed(
                                       [(i, k, tt) for i, k, tt in
                                        zip(instances, kinds, t)]))
        row.append(seconds)
      rows.append(row)
    alone = rows[0][0]
    tables[kind] = [[v / alone for v in row] for row in rows]
  return tables


def _with_pages_each(instances, lengths_each: list[list[int]], fn):
  """fn(tables per instance) with lengths_each[i]'s sequences allocated on instances[i]."""
  if not instances:
    return fn([])
  return _with_pages(instances[0], lengths_each[0],
                     lambda t: _with_pages_each(instances[1:], lengths_each[1:],
                                                lambda rest: fn([t] + rest)))


def measure_transfer(src, dst, opts, repeats: int) -> list:
  """One pass over the transfer buckets."""
  from pdjax.engine.transfer import transfer_kv
  points = []
  for n in opts.transfer_buckets:
    def move(tables, n=n):
      src_pages, dst_pages = tables
      nbytes = []
      seconds = _median_s(lambda: nbytes.append(transfer_kv(src, src_pages, dst, dst_pages).bytes),
                          repeats)
      return seconds, nbytes[-1]
    src_ids = src.tables.allocate("calib-src", n * opts.page_size)
    try:
      seconds, nbytes = _with_pages(dst, [n * opts.page_size],
                                    lambda t: move((src_ids, t[0])))
    finally:
      src.tables.free("calib-src")
    points.append({"pages": n, "x": [nbytes, 0], "seconds": seconds})
  return points
