"""Calibrating the simulator against the real engine: builds the config's instances, times
their steps, KV transfers, host sharing and layer-group streams (pdjax/engine/step_timing.py,
engine/stream_timing.py), then serves a small workload through the driver for its per-step
host time (`measure_host`), and returns the profile `pdjax.sim.calibrated` reads.
`python -m pdjax.calibrate` is the command that writes it.

It is the runner's (it drives the scheduler over engine instances), so the engine's timing
module does not reach up into pdjax.runner.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
import time

from pdjax.engine.step_timing import (_median_rounds, fit_points, measure_points,
                                      measure_sharing, measure_transfer)

HOST_REQUESTS = 48   # requests served to measure the driver's host time per step


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
