"""One serving instance: a device sub-mesh, its sharded params, its KV page pool, its programs.

The driver sees a narrow interface (JetStream-like): `prefill(seqs, prev)` and `decode(seqs,
prev)` dispatch a jitted step asynchronously and return a `PendingTokens` whose `.result()`
blocks for the host tokens. A row's input token may be a `PendingToken(row)` of `prev`, the step
still in flight here: its sampled tokens go from one program to the next on the device, so the
driver can dispatch step N+1 before step N's tokens reach the host (`device_tokens`); `tables` is the host-side block-table bookkeeping for this instance's pool. Every program
is compiled ahead of time, once per bucket, in `warm_up()`; calls go straight to the compiled
executables, so the steady state cannot recompile (a shape outside the buckets raises). With
`EngineOptions.lazy_compile` a step bucket is compiled on its first use instead (counted in
`lazy_compiles`; an offline run compiles only the buckets its batches need).
A runtime failure (jax.errors.JaxRuntimeError) of a dispatch or of a result is raised as
`DeviceError`, the one failure the driver survives; anything else propagates.
"""

from __future__ import annotations

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

from pdjax.engine import attention as attn_lib
from pdjax.engine import batch as batch_lib
from pdjax.engine import layer_groups
from pdjax.engine import mesh as mesh_lib
from pdjax.engine import programs
from pdjax.engine import ready_wait
from pdjax.engine.options import EngineOptions  # noqa: F401  (re-exported)
from pdjax.engine.runtime import compile_in_background, device_errors
from pdjax.kv.pages import BlockTables
from pdjax.models import param_layout as param_layout_lib
from pdjax.models.llama_config import LlamaConfig


class PendingTokens:
  """Tokens of a dispatched step; `result()` waits for them and returns the first `n`. A step
  that failed on the device raises DeviceError from either. `build_s` and `dispatch_s`: host
  seconds spent building the step's metadata and launching it."""

  def __init__(self, tokens, n: int, build_s: float = 0.0, dispatch_s: float = 0.0):
    self._tokens, self._n = tokens, n
    self.build_s, self.dispatch_s = build_s, dispatch_s

  wait_any = staticmethod(ready_wait.wait_any)   # the driver blocks instead of polling

  def arrays_to_wait(self) -> list:
    return [self._tokens]

  @property
  def device_tokens(self):
    """The sampled tokens on the device (int32 [token_rows]), for the next step's input."""
    return self._tokens

  def ready(self) -> bool:
    with device_errors():
      return self._tokens.is_ready()

  def result(self) -> list[int]:
    with device_errors():
      return np.asarray(self._tokens)[:self._n].tolist()


def place_params(mesh, params, num_layers: int = 0, layout: str = "stacked"):
  """(shardings, params on the mesh's devices). `params` is a host pytree (device_put: each
  device copies its shards out of it) or a restorer, a callable with an `abstract` tree of
  shapes and dtypes (models.orbax_checkpoint.OrbaxParams) that, given the shardings, reads
  each device's shards straight onto it: no host copy of the whole model per instance.
  layout "unrolled" (a one-device mesh; see param_layout.py) converts the stacked tree once,
  on the host before placing a host tree, on the device after restoring a checkpoint; a
  restorer with `unrolled(device)` (engine/reshard.py) gives that tree itself."""
  if layout == "stacked":
    if callable(params):
      shardings = mesh_lib.param_shardings(mesh, params.abstract)
      return shardings, params(shardings)
    shardings = mesh_lib.param_shardings(mesh, params)
    return shardings, jax.device_put(params, shardings)
  if mesh.size != 1:
    raise ValueError(f"the {layout} parameter layout needs a one-device mesh, not {mesh.size}")
  if hasattr(params, "unrolled"):
    params = params.unrolled(mesh.devices.flat[0])
  else:
    if callable(params):
      params = params(mesh_lib.param_shardings(mesh, params.abstract))
    params = param_layout_lib.to_layout(params, num_layers, layout)
  shardings = jax.tree_util.tree_map(lambda _: mesh_lib.replicated(mesh), params)
  return shardings, jax.device_put(params, shardings)


class Instance:

  device_tokens = True   # steps take PendingToken inputs: the driver may overlap steps
  streams_kv = True      # prefill(..., streams=...): KV streamed by layer groups (layer_groups.py)

  def __init__(self, spec: mesh_lib.InstanceSpec, cfg: LlamaConfig, params,
               opts: EngineOptions):
    """params: a host pytree or a checkpoint restorer (see `place_params`)."""
    self.name, self.role, self.cfg, self.opts = spec.name, spec.role, cfg, opts
    self.mesh = mesh_lib.instance_mesh(spec.devices)
    self.tp = len(spec.devices)
    self.param_layout = mesh_lib.param_layout(spec.devices, opts.param_layout)
    self.geom = batch_lib.PageGeometry(opts.num_pages, opts.page_size, opts.pages_per_seq)
    self.tables = BlockTables(opts.num_pages, opts.page_size)
    self.run_seed = opts.seed      # sampling's run seed: batch data, so `reset` may change it
    self.dtype = jnp.dtype(opts.dtype)
    self._param_sh, self.params = place_params(self.mesh, params, cfg.num_layers,
                                               self.param_layout)
    self.kv_sharding = jax.sharding.NamedSharding(self.mesh, mesh_lib.kv_pool_spec())
    self._kv_sh = (self.kv_sharding, self.kv_sharding)
    self._rep = mesh_lib.replicated(self.mesh)
    pool = (cfg.num_layers, cfg.num_kv_heads, opts.num_pages, opts.page_size, cfg.head_dim)
    # compiled once: a reset's fresh pool needs no jit cache (released between commands)
    self._empty_pool = jax.jit(lambda: (jnp.zeros(pool, self.dtype),
                                        jnp.zeros(pool, self.dtype)),
                               out_shardings=self._kv_sh).lower().compile()
    self.kv = self._empty_pool()
    self.kv_pool_shape = pool
    self.token_rows = opts.token_rows
    # scheduler.overlap "auto" turns overlap on here (see serving.resolve_overlap for CPU)
    self.overlap_by_default = spec.devices[0].platform != "cpu"
    self._no_prev = jax.device_put(np.zeros(self.token_rows, np.int32), self._rep)
    self._compiling: list = []     # CompilingPrograms not yet waited for (finish_compiles)
    self._count_lock = threading.Lock()
    self.compiles = 0              # programs compiled by XLA
    self.compiles_from_cache = 0   # programs a compilation cache served (persistent or
                                   # jax's in-process one)
    self.lazy_compiles = 0         # step programs compiled on first use (lazy_compile)
    self.lazy_compile_s = 0.0      # seconds those compiles took (inside the serving loop)
    self._prefill, self._decode, self._gather, self._scatter = {}, {}, {}, {}
    # kv.stream_layers: per (bucket, layer group) prefill programs, per layer group transfer
    # programs (engine/layer_groups.py)
    self._prefill_groups, self._gather_groups, self._scatter_groups = {}, {}, {}

  # ---- between runs (runner/instance_pool.py) ----------------------------------------------

  # What a run's builder sets on an instance (runner/build.py): dropped by `reset`.
  PER_RUN_ATTRIBUTES = ("cost", "shares_host", "node", "node_link", "seal_key")

  def reset(self, run_seed: int) -> None:
    """The instance as if just built, its compiled programs kept: an empty KV pool and page
    tables (no prefix cache, no host tier: the next run's builder attaches its own), the
    compile counters at zero, the next run's sampling seed. The previous run must have
    ended (every request terminal, every page returned)."""
    if self.tables.num_used_pages:
      raise RuntimeError(f"{self.name}: reset with {self.tables.num_used_pages} pages in use")
    self.kv = self._empty_pool()
    self.tables = BlockTables(self.opts.num_pages, self.opts.page_size)
    self.host_copies = None
    self.run_seed = int(run_seed)
    self.compiles = self.compiles_from_cache = self.lazy_compiles = 0
    self.lazy_compile_s = 0.0
    for name in self.PER_RUN_ATTRIBUTES:
      self.__dict__.pop(name, None)

  # ---- re-meshing (engine/remesh.py) -------------------------------------------------------

  def unload(self) -> None:
    """Frees the parameters and the KV pool on the devices, keeping the compiled programs (a
    standby instance: `load` brings it back)."""
    for leaf in jax.tree_util.tree_leaves((self.params, self.kv)):
      leaf.delete()
    self.params = self.kv = None

  def load(self, source) -> None:
    """Parameters resharded from `source` (engine/reshard.py's DeviceSource: the old
    instances' device arrays), an empty KV pool and page tables: a standby instance serves
    again."""
    _, self.params = place_params(self.mesh, source, self.cfg.num_layers, self.param_layout)
    self.kv = self._empty_pool()
    self.tables = BlockTables(self.opts.num_pages, self.opts.page_size)

  # ---- compilation -------------------------------------------------------------------------

  def _compile(self, fn, args, in_shardings, out_shardings, donate=()):
    """Lowers fn for args' shapes here and compiles it on a compile thread: returns a
    `CompilingProgram` (callable; the first call waits for the compile). `finish_compiles`
    waits for every one this instance started."""
    abstract = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), args)
    jitted = jax.jit(fn, in_shardings=in_shardings, out_shardings=out_shardings,
                     donate_argnums=donate)
    program = compile_in_background(jitted.lower(*abstract), self._count_compile)
    self._compiling.append(program)
    return program

  def _count_compile(self, by_xla: bool) -> None:
    with self._count_lock:   # (on a compile thread)
      if by_xla:
        self.compiles += 1
      else:
        self.compiles_from_cache += 1

  def finish_compiles(self) -> None:
    """Waits for every program this instance is compiling; raises a compile's failure."""
    compiling, self._compiling = self._compiling, []
    for program in compiling:
      program.wait()

  def _step_program(self, kind: str, example_batch):
    """A step program for the bucket of `example_batch`: (params, kv, packed batch, previous
    tokens) -> (tokens [token_rows], kv), KV donated."""
    step = programs.step_function(kind, self.cfg, self.dtype,
                                  attn_lib.resolve_impl(self.opts.attention_impl, self.mesh),
                                  self.param_layout, batch_lib.layout(example_batch),
                                  self.token_rows)
    in_sh, out_sh = mesh_lib.step_shardings(self.mesh, self._param_sh)
    return self._compile(step, (self.params, self.kv, batch_lib.pack(example_batch),
                                self._no_prev), in_sh, out_sh, donate=(1,))

  def warm_up(self, *, prefill: bool, decode: bool, transfer_to_tp: tuple[int, ...] = (),
              receive: bool = False, on_program=None, wait: bool = True) -> None:
    """Compiles every bucket of the programs this instance's role needs. on_program(what) is
    called after each one (start-up progress; `warm_up_programs` counts them). Programs
    compile on the compile thread while the next ones lower; wait=False returns before the
    last ones have (the caller's `finish_compiles` waits: engine/cluster.py overlaps one
    instance's compiles with the next one's lowering)."""
    o = self.opts
    done = on_program or (lambda what: None)
    steps = [(kind, n) for kind, on, buckets in (("prefill", prefill, o.prefill_buckets),
                                                 ("decode", decode, o.decode_buckets))
             if on and not o.lazy_compile for n in buckets]
    for kind, n in steps:   # lowered here, compiling on the compile thread
      self._program(kind, n)
    for kind, n in steps:
      self._run_once(self._program(kind, n), self._padding_batch(kind, n))
      done(f"{self.name} {kind}, {n} tokens" if kind == "prefill"
           else f"{self.name} {kind}, batch {n}")
    from pdjax.engine import transfer  # the transfer programs live beside their logic
    for dst_tp in transfer_to_tp:
      for n in o.transfer_buckets:
        self._gather[(n, dst_tp)] = transfer.compile_gather(self, n, dst_tp)
        done(f"{self.name} KV gather, {n} pages to tp={dst_tp}")
    if receive:
      for n in o.transfer_buckets:
        self._scatter[n] = transfer.compile_scatter(self, n)
        done(f"{self.name} KV scatter, {n} pages")
    if o.stream_layers:
      layer_groups.warm_up(self, prefill=prefill and not o.lazy_compile,
                           transfer_to_tp=transfer_to_tp, receive=receive, on_program=done)
    if wait:
      self.finish_compiles()

  @staticmethod
  def warm_up_programs(opts: EngineOptions, *, prefill: bool, decode: bool,
                       transfer_to_tp: tuple[int, ...] = (), receive: bool = False) -> int:
    """How many programs `warm_up` with these arguments compiles."""
    steps = 0 if opts.lazy_compile else (len(opts.prefill_buckets) * prefill
                                         + len(opts.decode_buckets) * decode)
    groups = opts.stream_layers * (
        (0 if opts.lazy_compile else len(opts.prefill_buckets) * prefill)
        + len(opts.transfer_buckets) * (len(transfer_to_tp) + receive))
    return steps + len(opts.transfer_buckets) * (len(transfer_to_tp) + receive) + groups

  def _padding_batch(self, kind: str, n: int) -> dict:
    return batch_lib.padding_batch(kind, self.geom, n, self.opts.max_prefill_seqs)

  def _program(self, kind: str, n: int):
    """The compiled step program of bucket n; compiled here on first use (warm-up, or a lazy
    bucket's first step)."""
    table = self._prefill if kind == "prefill" else self._decode
    if n not in table:
      table[n] = self._step_program(kind, self._padding_batch(kind, n))
    return table[n]

  def _run_once(self, compiled, padding_batch) -> None:
    """Executes a step on an all-padding batch (it writes no page) so that first-call costs
    (allocations, thread pools) fall in warm-up, not in the first request's TTFT."""
    tokens, self.kv = compiled(self.params, self.kv, batch_lib.pack(padding_batch),
                               self._no_prev)
    tokens.block_until_ready()

  # ---- the host KV tier --------------------------------------------------------------------

  host_copies = None
  host_page_weight = 0.5   # what a reloaded page saves against a recompute (routers' view;
                           # not measured on the engine yet)
  handoff = "transfer"

  def attach_host_tier(self, tier, host_bytes_per_s: float = 0.0,
                       handoff: str = "transfer") -> None:
    """Shares a node's host KV tier (pdjax/kv/host_tier.py, engine/host_copies.py); compiles
    its page gather and scatters. host_bytes_per_s: unused (the simulator's cost). handoff:
    the run's transfer function decides (engine/host_copies.transfer_through_host_tier)."""
    from pdjax.engine.host_copies import HostCopies
    self.host_copies = HostCopies(self, getattr(self, "_host_copy_programs", None))
    self._host_copy_programs = self.host_copies.compiled_programs   # kept across `reset`
    self.tables.attach_host(tier, self.host_copies.offload, self.role == "decode")

  @property
  def host_stats(self) -> dict:
    return self.host_copies.stats if self.host_copies is not None else {}

  def kv_bytes(self, num_pages: int) -> int:
    from pdjax.engine.transfer import page_bytes
    return num_pages * page_bytes(self)

  # ---- steps -------------------------------------------------------------------------------

  def prefill(self, seqs, prev: PendingTokens | None = None, *,
              streams=None) -> PendingTokens:
    """The ragged step: seqs is a list of (token_ids, start, pages, temperature, seed) — whole
    prompts, prompt chunks after a cached prefix, or one-token decode rows (mixed batches; the
    token may be a PendingToken of `prev`). Dispatches without waiting; the result holds each
    sequence's next token.
    streams (kv.stream_layers > 0): [(decode Instance, source pages, destination pages)], KV
    sent layer group by layer group while the step computes (engine/layer_groups.py); the
    result's `streams` holds their transfers in flight, in that order. (A Ray actor passes its
    own stream objects instead: `layer_groups.as_stream`.)"""
    t0 = time.perf_counter()
    if self.host_copies is not None:
      self.host_copies.land()
    n = batch_lib.pick_bucket(self.opts.prefill_buckets, sum(len(s[0]) for s in seqs))
    flat = batch_lib.pack(batch_lib.prefill_batch(self.geom, seqs, num_tokens=n,
                                                  max_seqs=self.opts.max_prefill_seqs,
                                                  run_seed=self.run_seed))
    if not streams:
      return self._launch(self._lazy("prefill", n), flat, prev, len(seqs), t0)
    if not self.opts.stream_layers:
      raise ValueError(f"{self.name}: streams given but kv.stream_layers is 0")
    t1 = time.perf_counter()
    with device_errors():
      tokens, sent = layer_groups.streamed_prefill(
          self, lambda layers: self._group_program(n, layers), flat,
          self._no_prev if prev is None else prev.device_tokens, streams)
    pending = PendingTokens(tokens, len(seqs), build_s=t1 - t0,
                            dispatch_s=time.perf_counter() - t1)
    pending.streams = sent
    return pending

  def _group_program(self, n: int, layers: tuple[int, int]):
    """Prefill bucket n's program for one layer group (compiled in warm-up, or now)."""
    key = (n, layers)
    if key not in self._prefill_groups:
      self._prefill_groups[key] = layer_groups.compile_group_program(
          self, n, layers, dict(attention=attn_lib.resolve_impl(self.opts.attention_impl,
                                                                self.mesh),
                                layout=self.param_layout))
    return self._prefill_groups[key]

  def decode(self, seqs, prev: PendingTokens | None = None) -> PendingTokens:
    """seqs: list of (last_token, position, pages, temperature, seed); last_token may be a
    PendingToken of `prev`. Dispatches without waiting."""
    t0 = time.perf_counter()
    if self.host_copies is not None:
      self.host_copies.land()
    n = batch_lib.pick_bucket(self.opts.decode_buckets, len(seqs))
    flat = batch_lib.pack(batch_lib.decode_batch(self.geom, seqs, batch_size=n,
                                                 run_seed=self.run_seed))
    return self._launch(self._lazy("decode", n), flat, prev, len(seqs), t0)

  def _lazy(self, kind: str, n: int):
    """The program of bucket n: compiled in warm-up, or now when lazy_compile and first used."""
    table = self._prefill if kind == "prefill" else self._decode
    if n not in table and self.opts.lazy_compile:
      t0 = time.perf_counter()
      program = self._program(kind, n)
      self.finish_compiles()   # (its compile time counts here, a failure raises here)
      self.lazy_compiles += 1
      self.lazy_compile_s += time.perf_counter() - t0
      return program
    return table[n]

  def _launch(self, program, flat, prev, n: int, t0: float) -> PendingTokens:
    t1 = time.perf_counter()
    with device_errors():
      tokens, self.kv = program(self.params, self.kv, flat,
                                self._no_prev if prev is None else prev.device_tokens)
    return PendingTokens(tokens, n, build_s=t1 - t0, dispatch_s=time.perf_counter() - t1)
