"""Layer-group KV streaming on the real engine (kv.stream_layers = G): a prefill step run as G
programs over consecutive layer groups, each group's KV sent to its decode instance as soon as
it is in the source pool, while the next group computes.

Why it overlaps without a host thread: every call here returns at once (JAX's asynchronous
dispatch). For each group g the host enqueues the group's step program, then the group's
transfer (`transfer.transfer_kv_async(..., layers=group)`: one gather program on the source,
one `jax.device_put` of single-device pieces, one scatter program on the destination), then
group g + 1's program. The runtime runs group g's device-to-device copy while group g + 1
computes (DMA engines on TPU/GPU, threads on CPU): only the last group's copy is exposed after
the prompt's compute ends. Per group the host pays a few dispatches, not a per-layer loop.

The programs: group 0 embeds the step's tokens and runs its layers; a middle group takes the
hidden state [T, hidden] and returns it; the last group ends with the norm, the logits and the
sampled tokens, exactly as the one-program prefill (`programs.prefill`) does — the same
operations in the same order, so the tokens are identical to the unstreamed step's. The
KV pools are donated through every group.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pdjax.engine import batch as batch_lib
from pdjax.engine import mesh as mesh_lib
from pdjax.engine import programs
from pdjax.engine import ready_wait
from pdjax.kv.layer_groups import group_bounds
from pdjax.engine.sampling import row_keys, sample
from pdjax.kv.transfer_result import TransferResult
from pdjax.models.llama import Llama, layer_group_params


def prefill_group(params, kv, flat, carry, *, model: Llama, layout, token_rows: int):
  """One layer group of the prefill step (model.layers = (a, b)). carry: the previous step's
  tokens (group 0: the input tokens may be read from them, as in `programs.prefill`) or the
  hidden state [T, hidden] the group before returned. Returns (hidden state, or the sampled
  tokens int32 [token_rows] from the last group; kv)."""
  batch = programs.unpack(flat, layout)
  meta = {k: batch[k] for k in ("positions", "slot_mapping", "kv_lens", "page_indices",
                                 "cu_q_lens", "num_seqs")}
  first, last = model.layers
  x = programs.input_tokens(batch, carry) if first == 0 else carry
  sub = layer_group_params(params, model.layers, model.layout)
  if last < model.cfg.num_layers:
    return model.apply(sub, x, kv, meta, None)
  rows = jnp.maximum(batch["cu_q_lens"][1:] - 1, 0)
  logits, kv = model.apply(sub, x, kv, meta, rows)
  keys = row_keys(batch["run_seed"][0], batch["seeds"], batch["kv_lens"])
  return programs._padded(sample(logits, batch["temperatures"], keys, batch["top_ps"]),
                          token_rows), kv


def compile_group_program(inst, n: int, layers: tuple[int, int], model_kwargs: dict):
  """Prefill bucket n's program for one layer group, KV donated."""
  model = Llama(inst.cfg, mode="prefill", dtype=inst.dtype, layers=layers, **model_kwargs)
  example = inst._padding_batch("prefill", n)
  fn = functools.partial(prefill_group, model=model,
                         layout=batch_lib.layout(example), token_rows=inst.token_rows)
  in_sh, out_sh = mesh_lib.step_shardings(inst.mesh, inst._param_sh)
  carry = (inst._no_prev if layers[0] == 0 else
           jax.ShapeDtypeStruct((n, inst.cfg.hidden_size), inst.dtype))
  return inst._compile(fn, (inst.params, inst.kv, batch_lib.pack(example), carry),
                       in_sh, out_sh, donate=(1,))


class StreamedTransfer:
  """A request's KV sent group by group (one `PendingTransfer` per layer group): ready once
  every group has landed; its result sums the groups' bytes, its seconds run from the first
  group's dispatch to the last landing observed."""

  def __init__(self, groups: list):
    self.groups = groups

  wait_any = staticmethod(ready_wait.wait_any)

  def arrays_to_wait(self) -> list:
    return [a for g in self.groups for a in g.arrays_to_wait()]

  def ready(self) -> bool:
    return all(g.ready() for g in self.groups)

  def result(self) -> TransferResult:
    results = [g.result() for g in self.groups]
    ends = tuple(g.start + r.seconds - self.groups[0].start
                 for g, r in zip(self.groups, results))
    return TransferResult(bytes=sum(r.bytes for r in results), seconds=max(ends),
                          group_ends_s=ends)


class LocalStream:
  """A stream to a decode instance in this process: each group's KV moved by
  `transfer.transfer_kv_async(..., layers=group)`; the step's result holds a StreamedTransfer."""

  def __init__(self, dst, src_pages: list[int], dst_pages: list[int]):
    self.dst, self.src_pages, self.dst_pages = dst, src_pages, dst_pages

  def send(self, inst, layers: tuple[int, int]):
    from pdjax.engine.transfer import transfer_kv_async
    return transfer_kv_async(inst, self.src_pages, self.dst, self.dst_pages, layers)

  def sent(self, groups: list) -> StreamedTransfer:
    return StreamedTransfer(groups)


def as_stream(item):
  """A prefill's `streams` item: (dst Instance, src pages, dst pages) is a LocalStream; an
  object with send(inst, layers) / sent(groups) (a Ray actor's offers: distributed/actor.py)
  is used as it is."""
  return LocalStream(*item) if isinstance(item, tuple) else item


def streamed_prefill(inst, program_of, flat, prev, streams):
  """Dispatches a prefill step as its layer groups' programs, each group's KV sent on every
  stream (`as_stream`) right after the group is enqueued. Returns (the last group's device
  tokens, each stream's `sent(groups)`). program_of(layers): the group's compiled program for
  this step's bucket."""
  streams = [as_stream(s) for s in streams]
  carry = prev
  sent = [[] for _ in streams]
  for layers in group_bounds(inst.cfg.num_layers, inst.opts.stream_layers):
    carry, inst.kv = program_of(layers)(inst.params, inst.kv, flat, carry)
    for out, stream in zip(sent, streams):
      out.append(stream.send(inst, layers))
  return carry, [stream.sent(groups) for stream, groups in zip(streams, sent)]


def warm_up(inst, *, prefill: bool, transfer_to_tp=(), receive: bool = False,
            on_program=None) -> None:
  """Compiles the layer groups' programs an instance's role needs: each prefill bucket's
  group programs, each transfer bucket's group gathers (per destination TP) and scatters."""
  from pdjax.engine import transfer
  done = on_program or (lambda what: None)
  o = inst.opts
  bounds = group_bounds(inst.cfg.num_layers, o.stream_layers)
  for layers in bounds:
    if prefill:
      for n in o.prefill_buckets:
        inst._group_program(n, layers)
        done(f"{inst.name} prefill, {n} tokens, layers {layers[0]}-{layers[1] - 1}")
    for dst_tp in transfer_to_tp:
      for n in o.transfer_buckets:
        inst._gather_groups[(n, dst_tp, layers)] = transfer.compile_gather(inst, n, dst_tp,
                                                                           layers)
        done(f"{inst.name} KV gather, {n} pages to tp={dst_tp}, layers {layers[0]}-{layers[1] - 1}")
    if receive:
      programs_by_bucket, known = {}, {}
      for n in o.transfer_buckets:
        programs_by_bucket[n] = transfer.compile_scatter(inst, n, known, layers)
        done(f"{inst.name} KV scatter, {n} pages, layers {layers[0]}-{layers[1] - 1}")
      inst._scatter_groups[layers] = programs_by_bucket
