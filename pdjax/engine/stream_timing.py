"""Measures what streaming KV by layer groups (kv.stream_layers) costs a prefill step on the
real engine: the simulator's `stream_group_s` (sim/stream_transfer.py), fitted by
`pdjax.calibrate` beside the step and transfer fits (engine/step_timing.py).

The simulator adds (G - 1) * stream_group_s to a streamed prefill step and stream_group_s to
each group's landing. Measured here: the largest prefill bucket's one-sequence step run as the
one program and as G layer-group programs whose KV streams to a decode instance, each timed
from dispatch to its tokens (the median of `repeats` runs, the transfers waited for outside
the timing, so they do not pile up); stream_group_s = (streamed - one program) / (G - 1),
never below 0. That is the host's extra dispatches and the device's extra program launches
per group, plus what the copies take from the step where they share its resources (on CPU
the same threads; on TPU/GPU mostly DMA engines, so little). G: kv.stream_layers when the
config sets it, else min(4, layers).
"""

from __future__ import annotations

import dataclasses
import statistics
import time

MAX_GROUPS = 4   # the groups measured when the config does not stream


def measure_stream_group_s(src, dst, mcfg, params, opts, stream_layers: int,
                           repeats: int) -> dict:
  """{"seconds": stream_group_s, "groups", "tokens", "one_program_s", "streamed_s"} measured
  on src's and dst's devices (a fresh pair of instances built to stream: the run's own
  programs stay as they are). A one-layer model has nothing to stream: seconds 0."""
  from pdjax.engine.cluster import build_instances
  groups = stream_layers or min(MAX_GROUPS, mcfg.num_layers)
  tokens = max(n for n in opts.prefill_buckets if n <= opts.max_model_len - 1)
  out = {"groups": groups, "tokens": tokens, "one_program_s": 0.0, "streamed_s": 0.0,
         "seconds": 0.0}
  if groups < 2:
    return out
  sopts = dataclasses.replace(opts, stream_layers=groups)
  s, d = build_instances([("prefill", 1, src.tp), ("decode", 1, dst.tp)], mcfg, params, sopts,
                         devices=list(src.mesh.devices.flat) + list(dst.mesh.devices.flat))
  src_pages = s.tables.allocate("calib-stream", tokens)
  dst_pages = d.tables.allocate("calib-stream", tokens + 1)[:len(src_pages)]
  seqs = [([3 + (7 * j) % (mcfg.vocab_size - 3) for j in range(tokens)], 0, src_pages, 0.0, 0)]
  try:
    one = _median_s(lambda: (s.prefill(seqs), None), repeats)
    streamed = _median_s(
        lambda: (p := s.prefill(seqs, streams=[(d, src_pages, dst_pages)]), p.streams[0]),
        repeats)
  finally:
    s.tables.free("calib-stream")
    d.tables.free("calib-stream")
  out.update(one_program_s=one, streamed_s=streamed,
             seconds=max(0.0, (streamed - one) / (groups - 1)))
  return out


def _median_s(dispatch, repeats: int) -> float:
  """The median seconds from dispatch to tokens; dispatch() -> (pending step, a transfer to
  wait for after the timing, or None)."""
  times = []
  for _ in range(max(repeats, 1) + 1):   # (+1: the first run's lazy work is not counted)
    start = time.perf_counter()
    pending, moving = dispatch()
    pending.result()
    times.append(time.perf_counter() - start)
    if moving is not None:
      moving.result()
  return statistics.median(times[1:])
