"""Measures the real engine's step times, KV transfers, host sharing and the driver's host time
per step: the points `pdjax.sim.calibrated` fits into the simulator's calibrated cost model
(`calibrate` returns the whole profile; `pdjax.calibrate` is the command that writes it).

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
point keeps its median over the rounds. Then it serves a small workload on the instances for
the driver's per-step host time that those step times miss (`measure_host`).
"""

from __future__ import annotations

import dataclasses
import os
import platform
import statistics
import sys
import time

MIN_POINT_S = 0.05
HOST_REQUESTS = 48   # requests served to measure the driver's host time per step


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


def measure_host(cfg, mcfg, instances, opts) -> dict:
  """The driver's host time per step that isolated step times miss (`calibrated.host_samples`):
  serves the config's workload (seed + 1, at most HOST_REQUESTS requests, EOS ignored; the
  validation workloads are others) disaggregated on the prefill and decode instances, overlap
  as the config resolves it, and fits it per step kind against the step's rows
  (`calibrated.fit_host_kinds`). Returns
  (host time fits, the same fits of the whole host wait: for reference, not charged)."""
  from pdjax.runner import serve_requests
  from pdjax.sim.calibrated import fit_host_kinds, host_samples
  from pdjax.workload.loader import load_workload
  w = cfg.workload.copy_and_resolve_references()
  with w.unlocked():
    w.num_requests, w.ignore_eos = min(w.num_requests, HOST_REQUESTS), True
  requests, _ = load_workload(w, seed=cfg.seed + 1, vocab_size=mcfg.vocab_size,
                              eos_ids=mcfg.eos_token_ids, max_model_len=opts.max_model_len)
  overlap = cfg.scheduler.get("overlap", "auto")
  result = serve_requests.serve("disaggregated",
                                [i for i in instances if i.role != "colocated"], requests,
                                overlap=overlap.lower() if isinstance(overlap, str) else overlap)
  return fit_host_kinds(host_samples(result.steps))


def calibrate(cfg, mcfg, repeats: int, rounds: int = 1) -> dict:
  import jax
  from pdjax.engine.cluster import build_instances, host_params
  from pdjax.sim import calibrated
  from pdjax.engine.options import engine_options
  opts = engine_options(cfg)   # the programs colocated and disaggregated runs use
  ragged = engine_options(cfg, chunked=True)   # a chunked run's: its prefill program packs
                                               # every decode row, so it has more rows
  c = cfg.cluster
  tiers = [("prefill", c.prefill.instances, c.prefill.tp),
           ("decode", c.decode.instances, c.decode.tp)]
  if sum(n * tp for _, n, tp in tiers) > jax.device_count():
    tiers = [("prefill", 1, c.prefill.tp), ("decode", 1, c.decode.tp)]   # one per TP degree
  if c.colocated.tp not in (c.prefill.tp, c.decode.tp):
    tiers.append(("colocated", 1, c.colocated.tp))
  params = host_params(mcfg, checkpoint=cfg.model.checkpoint, seed=cfg.seed, dtype=cfg.model.dtype)
  instances = build_instances(tiers, mcfg, params, opts)
  from pdjax.sim.calibrated import fit_step
  per_tp = {}
  for inst in instances:
    per_tp.setdefault(inst.tp, inst)
  src = next(i for i in instances if i.role == "prefill")
  dst = next(i for i in instances if i.role == "decode")
  same_tp = [i for i in instances if i.tp == instances[0].tp]
  ragged_tp = {}   # on the devices of the instance it shadows (a second program, same chips)
  if ragged.max_prefill_seqs != opts.max_prefill_seqs:
    ragged_tp = {tp: build_instances([(inst.role, 1, tp)], mcfg, params, ragged,
                                     devices=list(inst.mesh.devices.flat))[0]
                 for tp, inst in per_tp.items()}
  passes = []
  for r in range(rounds):   # each round measures everything once: drift hits all points alike
    print(f"round {r + 1}/{rounds}: steps at tp={sorted(per_tp)}, kv transfer "
          f"tp{c.prefill.tp}->tp{c.decode.tp}, host sharing over {len(same_tp)} instances",
          file=sys.stderr)
    passes.append({"steps": {tp: measure_points(inst, opts, repeats, mcfg.vocab_size)
                             for tp, inst in per_tp.items()},
                   "ragged": {tp: measure_points(inst, ragged, repeats, mcfg.vocab_size,
                                                 kinds=("prefill",))
                              for tp, inst in ragged_tp.items()},
                   "transfer": measure_transfer(src, dst, opts, repeats),
                   "sharing": measure_sharing(same_tp, opts, repeats)})
  merged = _median_rounds(passes)
  from pdjax.engine.stream_timing import measure_stream_group_s
  groups = cfg.kv.get("stream_layers", 0)
  print(f"layer-group streaming: {groups or 'up to 4'} groups, tp{src.tp}->tp{dst.tp}",
        file=sys.stderr)
  stream = measure_stream_group_s(src, dst, mcfg, params, opts, groups, repeats)
  print(f"host time: serving {min(cfg.workload.num_requests, HOST_REQUESTS)} requests "
        "disaggregated", file=sys.stderr)
  host, host_wait = measure_host(cfg, mcfg, instances, opts)
  transfer, err = fit_step([(*p["x"], p["seconds"]) for p in merged["transfer"]])
  sharing = {k: [[round(v, 4) for v in row] for row in table]
             for k, table in merged["sharing"].items()}
  by_tp = {}
  for tp, points in merged["steps"].items():   # one measured link serves every TP's entry
    fits = by_tp[tp] = fit_points(points)
    fits["transfer"] = transfer.to_json()
    fits["mean_rel_error"]["transfer"] = round(err, 4)
    fits["points"]["transfer"] = merged["transfer"]
    if tp in merged["ragged"]:   # chunked runs' prefill and mixed steps
      points = merged["ragged"][tp]["prefill"]
      fit, err = fit_step([(*p["x"], p["seconds"]) for p in points])
      fits["prefill_ragged"] = fit.to_json()
      fits["mean_rel_error"]["prefill_ragged"] = round(err, 4)
      fits["points"]["prefill_ragged"] = points
  device = jax.devices()[0]
  profile = {
      "format": calibrated.FORMAT,
      "model": dataclasses.asdict(mcfg), "model_name": cfg.model.checkpoint or cfg.model.preset,
      "dtype": cfg.model.dtype, "attention_impl": cfg.model.attention_impl,
      "kv_bytes_per_token": 2 * mcfg.num_layers * mcfg.num_kv_heads * mcfg.head_dim
                            * jax.numpy.dtype(cfg.model.dtype).itemsize,
      "hardware": {"backend": jax.default_backend(), "device_kind": device.device_kind,
                   "devices": jax.device_count(), "host_cpus": os.cpu_count(),
                   "processor": platform.machine()},
      "jax_version": jax.__version__, "created": time.strftime("%Y-%m-%d"),
      "engine": {"page_size": opts.page_size, "num_pages": opts.num_pages,
                 "max_model_len": opts.max_model_len, "max_prefill_seqs": opts.max_prefill_seqs,
                 "ragged_prefill_seqs": ragged.max_prefill_seqs,
                 "prefill_buckets": list(opts.prefill_buckets),
                 "decode_buckets": list(opts.decode_buckets),
                 "transfer_buckets": list(opts.transfer_buckets)},
      "transfer_measured": f"tp{c.prefill.tp}->tp{c.decode.tp}",
      "repeats": repeats, "rounds": rounds,
      "instances": {str(tp): fits for tp, fits in sorted(by_tp.items())},
      "host_sharing": sharing,
      "host_s": host,            # charged per step (pdjax.sim.calibrated.HostFit)
      "host_wait_s": host_wait,  # not charged: the whole wait, dispatch and readback included
      "stream_group_s": stream,  # per layer group of a streamed prefill (engine/stream_timing.py)
  }
  return profile
