"""One serving instance: a device sub-mesh, its sharded params, its KV page pool, its programs.

The driver sees a narrow interface (JetStream-like): `prefill(seqs)` and `decode(seqs)` dispatch a
jitted step asynchronously and return a `PendingTokens` whose `.result()` blocks for the host
tokens; `tables` is the host-side block-table bookkeeping for this instance's pool. Every program
is compiled ahead of time, once per bucket, in `warm_up()`; calls go straight to the compiled
executables, so the steady state cannot recompile (a shape outside the buckets raises).
A runtime failure (jax.errors.JaxRuntimeError) of a dispatch or of a result is raised as
`DeviceError`, the one failure the driver survives; anything else propagates.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from pdjax.engine import attention as attn_lib
from pdjax.engine import batch as batch_lib
from pdjax.engine import mesh as mesh_lib
from pdjax.engine import programs
from pdjax.engine.options import EngineOptions  # noqa: F401  (re-exported)
from pdjax.engine.runtime import compile_lowered, device_errors
from pdjax.kv.pages import BlockTables
from pdjax.models.llama import Llama
from pdjax.models.llama_config import LlamaConfig


class PendingTokens:
  """Tokens of a dispatched step; `result()` waits for them and returns the first `n`. A step
  that failed on the device raises DeviceError from either."""

  def __init__(self, tokens, n: int):
    self._tokens, self._n = tokens, n

  def ready(self) -> bool:
    with device_errors():
      return self._tokens.is_ready()

  def result(self) -> list[int]:
    with device_errors():
      return np.asarray(self._tokens)[:self._n].tolist()


def place_params(mesh, params):
  """(shardings, params on the mesh's devices). `params` is a host pytree (device_put: each
  device copies its shards out of it) or a restorer, a callable with an `abstract` tree of
  shapes and dtypes (models.orbax_checkpoint.OrbaxParams) that, given the shardings, reads
  each device's shards straight onto it: no host copy of the whole model per instance."""
  if callable(params):
    shardings = mesh_lib.param_shardings(mesh, params.abstract)
    return shardings, params(shardings)
  shardings = mesh_lib.param_shardings(mesh, params)
  return shardings, jax.device_put(params, shardings)


class Instance:

  def __init__(self, spec: mesh_lib.InstanceSpec, cfg: LlamaConfig, params,
               opts: EngineOptions):
    """params: a host pytree or a checkpoint restorer (see `place_params`)."""
    self.name, self.role, self.cfg, self.opts = spec.name, spec.role, cfg, opts
    self.mesh = mesh_lib.instance_mesh(spec.devices)
    self.tp = len(spec.devices)
    self.geom = batch_lib.PageGeometry(opts.num_pages, opts.page_size, opts.pages_per_seq)
    self.tables = BlockTables(opts.num_pages, opts.page_size)
    self.dtype = jnp.dtype(opts.dtype)
    self._param_sh, self.params = place_params(self.mesh, params)
    self.kv_sharding = jax.sharding.NamedSharding(self.mesh, mesh_lib.kv_pool_spec())
    self._kv_sh = (self.kv_sharding, self.kv_sharding)
    self._rep = mesh_lib.replicated(self.mesh)
    pool = (cfg.num_layers, cfg.num_kv_heads, opts.num_pages, opts.page_size, cfg.head_dim)
    self.kv = jax.jit(lambda: (jnp.zeros(pool, self.dtype), jnp.zeros(pool, self.dtype)),
                      out_shardings=self._kv_sh)()
    self.kv_pool_shape = pool
    self.compiles = 0              # programs compiled by XLA
    self.compiles_from_cache = 0   # programs a compilation cache served (persistent or
                                   # jax's in-process one)
    self._prefill, self._decode, self._gather, self._scatter = {}, {}, {}, {}

  # ---- compilation -------------------------------------------------------------------------

  def _compile(self, fn, args, in_shardings, out_shardings, donate=()):
    abstract = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), args)
    jitted = jax.jit(fn, in_shardings=in_shardings, out_shardings=out_shardings,
                     donate_argnums=donate)
    compiled, by_xla = compile_lowered(jitted.lower(*abstract))
    if by_xla:
      self.compiles += 1
    else:
      self.compiles_from_cache += 1
    return compiled

  def _step_program(self, fn, mode, example_batch):
    model = Llama(self.cfg, mode=mode, dtype=self.dtype,
                  attention=attn_lib.resolve_impl(self.opts.attention_impl, self.mesh))
    batch_sh = jax.tree_util.tree_map(lambda _: self._rep, example_batch)
    return self._compile(functools.partial(fn, model=model, seed=self.opts.seed),
                         (self.params, self.kv, example_batch),
                         (self._param_sh, self._kv_sh, batch_sh), (self._rep, self._kv_sh),
                         donate=(1,))

  def warm_up(self, *, prefill: bool, decode: bool, transfer_to_tp: tuple[int, ...] = (),
              receive: bool = False) -> None:
    """Compiles every bucket of the programs this instance's role needs."""
    o = self.opts
    if prefill:
      for n in o.prefill_buckets:
        b = batch_lib.prefill_batch(self.geom, [], num_tokens=n, max_seqs=o.max_prefill_seqs)
        self._prefill[n] = self._step_program(programs.prefill, "prefill", b)
        self._run_once(self._prefill[n], b)
    if decode:
      for n in o.decode_buckets:
        b = batch_lib.decode_batch(self.geom, [], batch_size=n)
        self._decode[n] = self._step_program(programs.decode, "decode", b)
        self._run_once(self._decode[n], b)
    from pdjax.engine import transfer  # the transfer programs live beside their logic
    for dst_tp in transfer_to_tp:
      for n in o.transfer_buckets:
        self._gather[(n, dst_tp)] = transfer.compile_gather(self, n, dst_tp)
    if receive:
      for n in o.transfer_buckets:
        self._scatter[n] = transfer.compile_scatter(self, n)

  def _run_once(self, compiled, padding_batch) -> None:
    """Executes a step on an all-padding batch (it writes no page) so that first-call costs
    (allocations, thread pools) fall in warm-up, not in the first request's TTFT."""
    tokens, self.kv = compiled(self.params, self.kv, padding_batch)
    tokens.block_until_ready()

  # ---- steps -------------------------------------------------------------------------------

  def prefill(self, seqs) -> PendingTokens:
    """The ragged step: seqs is a list of (token_ids, start, pages, temperature, seed) — whole
    prompts, prompt chunks after a cached prefix, or one-token decode rows (mixed batches).
    Dispatches without waiting; the result holds each sequence's next token."""
    n = batch_lib.pick_bucket(self.opts.prefill_buckets, sum(len(s[0]) for s in seqs))
    b = batch_lib.prefill_batch(self.geom, seqs, num_tokens=n,
                                max_seqs=self.opts.max_prefill_seqs)
    with device_errors():
      tokens, self.kv = self._prefill[n](self.params, self.kv, b)
    return PendingTokens(tokens, len(seqs))

  def decode(self, seqs) -> PendingTokens:
    """seqs: list of (last_token, position, pages, temperature, seed). Dispatches without
    waiting."""
    n = batch_lib.pick_bucket(self.opts.decode_buckets, len(seqs))
    b = batch_lib.decode_batch(self.geom, seqs, batch_size=n)
    with device_errors():
      tokens, self.kv = self._decode[n](self.params, self.kv, b)
    return PendingTokens(tokens, len(seqs))
