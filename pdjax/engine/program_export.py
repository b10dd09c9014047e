"""Exports the engine's own programs for TPU and GPU ahead of time, on any host (no devices).

The programs are the ones `Instance` compiles, built by the same functions (programs.bind_step,
transfer.gather_function, transfer.scatter_function over a bucket's transfer.slot_sizes) with
the same shardings (mesh.step_shardings, transfer.gather_shardings,
transfer.scatter_shardings), on a `jax.sharding.AbstractMesh` of the
instance's TP size (an instance over several hosts, cluster.<tier>.hosts, is one 1-D mesh over
every host's devices, host by host, as pdjax/distributed/host_group.py builds it: the same
SPMD program of num_partitions = TP, which each host's process runs on its own tp / hosts
devices; a case says its layout, e.g. "2 hosts x 4 chips"): `jax.export.export(..., platforms=[target])` then runs the Pallas attention
kernels' Mosaic (tpu) or Triton (cuda) lowering inside the real step, at a real model's shapes,
under the instance's shard_map, with nothing but the host's CPU.

A case is ok when it exports and the module says what the engine relies on:
- step programs (prefill, decode): the target's attention custom call is there, and it sees one
  device's kv heads (the shard_map split the pools by TP); the KV pools are donated (aliased to
  the outputs: without it a TPU would hold two pools);
- every program: it spans `tp` devices, and its KV inputs carry the instance's sharding.

What this does not export (stated by `NOT_EXPORTED`, printed by the command): the KV copy between
meshes (`jax.device_put` of single-device shards: a runtime transfer, not a program), the host
KV tier's copies (device_put to host), Mosaic's and Triton's compilation to machine code, and
timing. Those need the hardware.
"""

from __future__ import annotations

import dataclasses
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import export
from jax.sharding import AbstractMesh

from kernels_pallas.attention_ops import AttentionOps
from kernels_pallas.lower_check import CUSTOM_CALLS, TARGETS, VARIANT
from pdjax.engine import batch as batch_lib
from pdjax.engine import mesh as mesh_lib
from pdjax.engine import programs, transfer
from pdjax.engine.options import EngineOptions
from pdjax.models.llama import Llama, init_params
from pdjax.models.llama_config import PRESETS, LlamaConfig

PROGRAMS = ("prefill", "decode", "gather", "scatter")

NOT_EXPORTED = (
    "the KV copy between meshes (jax.device_put of single-device shards) is a runtime transfer, "
    "not a program: only hardware checks it",
    "the host KV tier's copies (device_put to host memory) are runtime transfers too",
    "Mosaic's and Triton's compilation to machine code (VMEM and register budgets) and timing "
    "need the hardware",
)


@dataclasses.dataclass(frozen=True)
class ModelShape:
  """A model and the serving shapes to lower it at: its engine options (buckets, pages, dtype)
  and the TP degrees of its instances; layouts: (tp, hosts) of each instance kind (empty: each
  TP on one host)."""
  name: str
  cfg: LlamaConfig
  opts: EngineOptions
  tps: tuple[int, ...]
  layouts: tuple[tuple[int, int], ...] = ()

  def instance_layouts(self) -> tuple[tuple[int, int], ...]:
    return self.layouts or tuple((tp, 1) for tp in self.tps)


# Real models at serving shapes. Llama-3-8B: bfloat16, 8k context, 16k pages of 16 tokens
# (32 GiB of KV), a 2,048-token prefill step of up to 8 sequences and a decode batch of 64,
# TP 1 and 8. SmolLM2-135M as configs/smollm2.py serves it (float32, 1k context, 512 pages,
# buckets up to 1,024 tokens and 16 sequences), TP 1 and 3 (its 3 kv heads).
BUILTIN = {
    "llama3_8b": ModelShape("llama3_8b", PRESETS["llama3_8b"], EngineOptions(
        page_size=16, num_pages=16384, max_model_len=8192, prefill_buckets=(2048,),
        max_prefill_seqs=8, decode_buckets=(64,), dtype="bfloat16", attention_impl="pallas"),
        (1, 8)),
    "smollm2_135m": ModelShape("smollm2_135m", PRESETS["smollm2_135m"], EngineOptions(
        page_size=16, num_pages=512, max_model_len=1024, prefill_buckets=(1024,),
        max_prefill_seqs=4, decode_buckets=(16,), dtype="float32", attention_impl="pallas"),
        (1, 3)),
}


def shape_from_config(cfg, name: str) -> ModelShape:
  """A run config's model at its engine options (every bucket; a compare or chunked run's
  ragged prefill sized for chunking) with the Pallas attention, and the TP and hosts
  (cluster.<tier>.hosts) of each tier it runs. Raises config.ConfigError on a bad model key or
  hosts that do not divide the tier's TP."""
  from pdjax import config as config_lib
  from pdjax.engine.options import engine_options
  mcfg = config_lib.model_config(cfg)
  chunked = "chunked" in config_lib.modes(cfg)
  opts = dataclasses.replace(engine_options(cfg, chunked=chunked), attention_impl="pallas")
  tiers = [(role, tp) for mode in {config_lib.RUNS[m] for m in config_lib.modes(cfg)}
           for role, count, tp in config_lib.tiers(cfg)[mode] if count > 0]
  layouts = set()
  for role, tp in tiers:
    hosts = cfg.cluster[role].get("hosts", 1)
    if type(hosts) is not int or hosts < 1 or tp % hosts:
      raise config_lib.ConfigError(f"cluster.{role}.hosts={hosts!r} does not divide "
                                   f"cluster.{role}.tp={tp} (each host owns tp / hosts devices)")
    layouts.add((tp, hosts))
  return ModelShape(name, mcfg, opts, tuple(sorted({tp for _, tp in tiers})),
                    tuple(sorted(layouts)))


@dataclasses.dataclass(frozen=True)
class ProgramCase:
  """One engine program of one model, lowered for one target on an instance of `tp` devices
  over `hosts` hosts. n: the bucket (prefill tokens, decode sequences, transfer pages); dst_tp:
  a gather's destination TP."""
  model: ModelShape
  target: str
  program: str
  tp: int
  n: int
  dst_tp: int | None = None
  hosts: int = 1

  def layout(self) -> str:
    """The instance's process layout, e.g. "2 hosts x 4 chips" ("" on one host)."""
    return f"{self.hosts} hosts x {self.tp // self.hosts} chips" if self.hosts > 1 else ""

  def label(self) -> str:
    what = {"prefill": f"{self.n} tokens", "decode": f"batch {self.n}",
            "gather": f"{self.n} pages to tp{self.dst_tp}", "scatter": f"{self.n} pages"}
    where = f" ({self.layout()})" if self.hosts > 1 else ""
    return (f"{self.target:<4} {self.model.name} tp{self.tp}{where} {self.program:<7} "
            f"{what[self.program]}")


@dataclasses.dataclass(frozen=True)
class ProgramResult:
  case: ProgramCase
  ok: bool
  message: str      # what the module showed, or the first thing wrong / the error's first line
  seconds: float

  def line(self) -> str:
    status = "ok   " if self.ok else "FAIL "
    message = self.message if len(self.message) <= 240 else self.message[:240] + "..."
    return f"{status} {self.case.label()}  {message} ({self.seconds:.1f}s)"


def cases(models, targets=TARGETS, program_names=PROGRAMS) -> list[ProgramCase]:
  """Every bucket of each step program, and the smallest and largest transfer bucket (from
  each TP to each TP) of the gather and scatter, per model, target and instance layout (TP
  and hosts)."""
  out = []
  for model in models:
    o = model.opts
    pages = sorted({o.transfer_buckets[0], o.transfer_buckets[-1]})
    for target in targets:
      for tp, hosts in model.instance_layouts():
        for program in program_names:
          if program in ("prefill", "decode"):
            buckets = o.prefill_buckets if program == "prefill" else o.decode_buckets
            out += [ProgramCase(model, target, program, tp, n, hosts=hosts) for n in buckets]
          elif program == "gather":
            out += [ProgramCase(model, target, program, tp, n, dst, hosts=hosts)
                    for dst in model.tps for n in pages]
          else:
            out += [ProgramCase(model, target, program, tp, n, hosts=hosts) for n in pages]
  return out


def _abstract(x):
  return jax.ShapeDtypeStruct(np.shape(x), x.dtype)


def _jitted(case: ProgramCase):
  """(jitted function, abstract arguments, index of the first KV pool among the flattened
  inputs) of the case's program, as Instance would compile it, on an AbstractMesh of case.tp
  devices."""
  model, o = case.model, case.model.opts
  mesh = AbstractMesh((case.tp,), (mesh_lib.TP_AXIS,))
  dtype = jnp.dtype(o.dtype)
  cfg = model.cfg
  pool = jax.ShapeDtypeStruct((cfg.num_layers, cfg.num_kv_heads, o.num_pages, o.page_size,
                               cfg.head_dim), dtype)
  kv = (pool, pool)
  if case.program in ("prefill", "decode"):
    params = jax.eval_shape(lambda: init_params(cfg, 0, dtype))
    geom = batch_lib.PageGeometry(o.num_pages, o.page_size, o.pages_per_seq)
    example = batch_lib.padding_batch(case.program, geom, case.n, o.max_prefill_seqs)
    attention = AttentionOps(impl="pallas", mesh=mesh, variant=VARIANT[case.target])
    step = programs.bind_step(case.program, Llama(cfg, mode=case.program, dtype=dtype,
                                                  attention=attention),
                              layout=batch_lib.layout(example),
                              token_rows=o.token_rows)
    in_sh, out_sh = mesh_lib.step_shardings(mesh, mesh_lib.param_shardings(mesh, params))
    args = (params, kv, _abstract(batch_lib.pack(example)),
            jax.ShapeDtypeStruct((o.token_rows,), jnp.int32))
    jitted = jax.jit(step, in_shardings=in_sh, out_shardings=out_sh, donate_argnums=(1,))
    return jitted, args, len(jax.tree_util.tree_leaves(params))
  slots = transfer.slot_sizes(o.transfer_buckets, case.n)   # a transfer bucket's page slots
  ids = jax.ShapeDtypeStruct((sum(slots),), jnp.int32)
  if case.program == "gather":
    out_sh = transfer.gather_shardings(mesh, case.dst_tp, slots)
    in_sh, _ = mesh_lib.step_shardings(mesh, None)
    jitted = jax.jit(transfer.gather_function(case.tp, case.dst_tp, slots),
                     in_shardings=(in_sh[1], in_sh[2]), out_shardings=out_sh)
    return jitted, (kv, ids), 0
  pages = tuple(jax.ShapeDtypeStruct((2, cfg.num_layers, cfg.num_kv_heads, n, o.page_size,
                                      cfg.head_dim), dtype) for n in slots)
  in_sh, out_sh = transfer.scatter_shardings(mesh, len(slots))
  jitted = jax.jit(transfer.scatter_function(slots), in_shardings=in_sh, out_shardings=out_sh,
                   donate_argnums=(0,))
  return jitted, (kv, pages[0] if len(slots) == 1 else pages, ids), 0


def _kv_spec_ok(exported, mesh, kv_at: int) -> bool:
  shardings = exported.in_shardings_jax(mesh)
  want = mesh_lib.kv_pool_spec()
  return all(s is not None and s.spec == want for s in shardings[kv_at:kv_at + 2])


def _kernel_operands(text: str, call: str) -> list[str]:
  """The operand types of the first `call` custom call, e.g. ['64xi32', ..., '1x16384x16x128xbf16']."""
  for line in text.splitlines():
    if f"custom_call @{call}(" in line:
      return re.findall(r"tensor<([0-9x]+x(?:bf16|f32|f16|i32))>", line.split(" : (", 1)[-1])
  return []


def _main_signature(text: str) -> str:
  return next((line for line in text.splitlines() if "func.func public @main(" in line), "")


def check(case: ProgramCase, exported, kv_at: int) -> tuple[bool, str]:
  """Whether the exported module is what the engine needs (see the module docstring), and the
  line that says so or names the first thing wrong. kv_at: the index of the first KV pool
  among the flattened inputs."""
  mesh = AbstractMesh((case.tp,), (mesh_lib.TP_AXIS,))
  if exported.nr_devices != case.tp:
    return False, f"spans {exported.nr_devices} devices, not {case.tp}"
  if not _kv_spec_ok(exported, mesh, kv_at):
    return False, "the KV pools' input sharding is not P(None, 'tp', ...)"
  text = exported.mlir_module()
  if case.hosts > 1 and f"mhlo.num_partitions = {case.tp} " not in text:
    return False, f"not one SPMD program of {case.tp} partitions over {case.layout()}"
  where = f" as {case.layout()}" if case.hosts > 1 else ""
  parts = [f"{case.tp} device{'s' * (case.tp > 1)}{where}, KV sharded by kv heads"]
  if case.program in ("prefill", "decode", "scatter"):
    if _main_signature(text).count("tf.aliasing_output") < 2:
      return False, "the KV pools are not donated (no aliasing of both pools to outputs)"
    parts.append("KV donated")
  if case.program in ("prefill", "decode"):
    call = CUSTOM_CALLS[case.target]
    if f"custom_call @{call}(" not in text:
      return False, f"no {call} custom call: the Pallas attention was not lowered"
    cfg, o = case.model.cfg, case.model.opts
    dtype = {"bfloat16": "bf16", "float32": "f32", "float16": "f16"}[o.dtype]
    want = f"{cfg.num_kv_heads // case.tp}x{o.num_pages}x{o.page_size}x{cfg.head_dim}x{dtype}"
    operands = _kernel_operands(text, call)
    if operands.count(want) != 2:
      return False, (f"the kernel does not take one device's K and V pages {want} (its "
                     f"operands: {', '.join(operands)})")
    parts.insert(0, f"{call}, kernel KV {want}")
  return True, "; ".join(parts)


def lower(case: ProgramCase) -> ProgramResult:
  """Exports the case for its target (custom-call safety check off: the module is for checking,
  not for shipping) and checks it."""
  start = time.perf_counter()
  try:
    jitted, args, kv_at = _jitted(case)
    call = CUSTOM_CALLS[case.target]
    exported = export.export(jitted, platforms=[case.target],
                             disabled_checks=[export.DisabledSafetyCheck.custom_call(call)])(*args)
    ok, message = check(case, exported, kv_at)
  except Exception as e:  # noqa: BLE001 -- any lowering error is this case's result
    lines = str(e).strip().splitlines() or [""]
    return ProgramResult(case, False, f"{type(e).__name__}: {lines[0]}",
                         time.perf_counter() - start)
  return ProgramResult(case, ok, message, time.perf_counter() - start)
