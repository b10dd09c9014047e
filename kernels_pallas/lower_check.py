"""Lowers every public Pallas kernel for TPU (Mosaic) and GPU (Triton) ahead of time, on any host.

  python -m kernels_pallas.lower_check [--fast] [--targets tpu,cuda] [--kernels decode,prefill]

No TPU or GPU is needed: `jax.export.export(jax.jit(f), platforms=[target])` runs the target's
Pallas lowering on abstract inputs (jax.ShapeDtypeStruct), which applies Mosaic's block-shape
rules on TPU and Triton's power-of-two rules on GPU, things interpret mode never checks. A case is
"ok" only when the exported module holds the target's own custom call (`tpu_custom_call`,
`__gpu$xla.gpu.triton`), so a kernel that silently fell back to another path would fail. The
custom-call safety check is disabled: these calls carry no serialization guarantee, and the
export is for checking, not for shipping. What it cannot give: Mosaic's and Triton's compilation
to machine code (VMEM budgets, vector layouts, register pressure) and timing, which need hardware.

One line per case (`ok` or `FAIL` with the first line of the error), a summary line, and exit
status 1 when any case fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
import time

import jax
import jax.numpy as jnp
from jax import export

from kernels_pallas.paged_attention.api import paged_attention
from kernels_pallas.prefill_attention.api import ragged_paged_attention

TARGETS = ("tpu", "cuda")
KERNELS = ("decode", "prefill")
CUSTOM_CALLS = {"tpu": "tpu_custom_call", "cuda": "__gpu$xla.gpu.triton"}
VARIANT = {"tpu": "tpu", "cuda": "gpu"}           # export platform -> kernel flavour
DTYPES = {"bf16": jnp.bfloat16, "f32": jnp.float32}
# (num_heads, num_kv_heads): GQA 4 (Llama-3-8B is 32/8), GQA 3 (SmolLM2-135M is 9/3).
HEADS = ((8, 2), (32, 8), (9, 3))
HEAD_DIMS = (64, 128)
PAGE_SIZES = (16, 32, 64)
# Block choices: the decode kernels' pages_per_compute_block, the TPU prefill kernel's q_block
# (token rows per program); None is the kernel's own choice. The GPU prefill kernel takes none.
BLOCKS = {("decode", "tpu"): (None, 1, 8), ("decode", "cuda"): (None, 1, 8),
          ("prefill", "tpu"): (None, 32), ("prefill", "cuda"): (None,)}
# The --fast subset: SmolLM2's and Llama-3-8B's head shapes, bfloat16, 16-token pages.
FAST_HEADS = ((9, 3, 64), (32, 8, 128))

MAX_CONTEXT = 1024   # tokens a sequence may hold (sets pages_per_seq)
BATCH = 8            # decode sequences; prefill max_seqs
PREFILL_TOKENS = 512


@dataclasses.dataclass(frozen=True)
class Case:
  """One kernel lowered for one target at one shape and block choice."""
  target: str        # "tpu" | "cuda"
  kernel: str        # "decode" | "prefill"
  dtype: str         # "bf16" | "f32"
  num_heads: int
  num_kv_heads: int
  head_dim: int
  page_size: int
  block: int | None = None

  def label(self) -> str:
    block = "default" if self.block is None else str(self.block)
    block_name = "ppcb" if self.kernel == "decode" else "q_block"
    return (f"{self.target:<4} {self.kernel:<7} {self.dtype:<4} "
            f"H{self.num_heads}/KV{self.num_kv_heads} D{self.head_dim} "
            f"page{self.page_size} {block_name}={block}")


@dataclasses.dataclass(frozen=True)
class Result:
  case: Case
  ok: bool
  message: str       # the custom call found, or the first line of the error
  seconds: float

  def line(self) -> str:
    status = "ok   " if self.ok else "FAIL "
    message = self.message if len(self.message) <= 200 else self.message[:200] + "..."
    return f"{status} {self.case.label()}  {message} ({self.seconds:.1f}s)"


def abstract_args(case: Case) -> tuple:
  """The kernel's arguments as shapes and dtypes only: a full pool of pages, every block table
  MAX_CONTEXT tokens wide."""
  dtype = DTYPES[case.dtype]
  pages_per_seq = -(-MAX_CONTEXT // case.page_size)
  pages = jax.ShapeDtypeStruct(
      (case.num_kv_heads, BATCH * pages_per_seq, case.page_size, case.head_dim), dtype)

  def i32(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.int32)

  if case.kernel == "decode":
    q = jax.ShapeDtypeStruct((BATCH, case.num_heads, case.head_dim), dtype)
    return q, pages, pages, i32(BATCH), i32(BATCH, pages_per_seq)
  q = jax.ShapeDtypeStruct((PREFILL_TOKENS, case.num_heads, case.head_dim), dtype)
  return q, pages, pages, i32(BATCH), i32(BATCH, pages_per_seq), i32(BATCH + 1), i32(1)


def kernel_fn(case: Case):
  """The public kernel, forced to the target's flavour (the TPU prefill kernel's own function
  when a q_block is chosen: the public call does not take one)."""
  variant = VARIANT[case.target]
  if case.kernel == "decode":
    return lambda *a: paged_attention(*a, pages_per_compute_block=case.block, variant=variant)
  if case.block is None:
    return lambda *a: ragged_paged_attention(*a, variant=variant)
  if case.target != "tpu":
    raise ValueError(f"block: the {case.target} prefill kernel takes no block choice")
  from kernels_pallas.prefill_attention.tpu import ragged_paged_attention_tpu
  return lambda *a: ragged_paged_attention_tpu(*a, sm_scale=case.head_dim ** -0.5,
                                               q_block=case.block)


def lower(case: Case) -> Result:
  """Exports the case for its target; ok only when the module holds the target's custom call."""
  start = time.perf_counter()
  call = CUSTOM_CALLS[case.target]
  try:
    exported = export.export(
        jax.jit(kernel_fn(case)), platforms=[case.target],
        disabled_checks=[export.DisabledSafetyCheck.custom_call(call)])(*abstract_args(case))
    text = exported.mlir_module()
  except Exception as e:  # noqa: BLE001 -- any lowering error is this case's result
    lines = str(e).strip().splitlines() or [""]
    return Result(case, False, f"{type(e).__name__}: {lines[0]}", time.perf_counter() - start)
  found = f"custom_call @{call}(" in text
  message = call if found else f"no {call} custom call in the exported module"
  return Result(case, found, message, time.perf_counter() - start)


def grid(targets=TARGETS, kernels=KERNELS, fast: bool = False) -> list[Case]:
  """The full grid (targets x kernels x dtypes x head shapes x head dims x page sizes x block
  choices), or the --fast subset (default blocks, bf16, page 16, SmolLM2 and Llama-3-8B)."""
  cases = []
  for target, kernel in itertools.product(targets, kernels):
    if fast:
      cases += [Case(target, kernel, "bf16", h, kv, d, 16) for h, kv, d in FAST_HEADS]
      continue
    for dtype, (h, kv), d, page, block in itertools.product(
        DTYPES, HEADS, HEAD_DIMS, PAGE_SIZES, BLOCKS[kernel, target]):
      cases.append(Case(target, kernel, dtype, h, kv, d, page, block))
  return cases


def _names(text: str, allowed: tuple) -> tuple:
  names = tuple(n.strip() for n in text.split(",") if n.strip())
  bad = [n for n in names if n not in allowed]
  if bad or not names:
    raise argparse.ArgumentTypeError(f"expected a comma list of {allowed}, got {text!r}")
  return names


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m kernels_pallas.lower_check",
                                   description=__doc__.splitlines()[0])
  parser.add_argument("--targets", type=lambda t: _names(t, TARGETS), default=TARGETS,
                      help="comma list of export platforms (default: tpu,cuda)")
  parser.add_argument("--kernels", type=lambda k: _names(k, KERNELS), default=KERNELS,
                      help="comma list of kernels (default: decode,prefill)")
  parser.add_argument("--fast", action="store_true",
                      help="the test suite's subset: SmolLM2 and Llama-3-8B heads, bf16, "
                      "page 16, default blocks")
  args = parser.parse_args(argv)
  return 1 if run(grid(args.targets, args.kernels, args.fast)) else 0


def run(cases: list[Case], label: str = "") -> int:
  """Lowers the cases, printing a line each and a summary (led by `label`); returns how many
  failed."""
  failed = lowered = 0
  start = time.perf_counter()
  for case in cases:
    result = lower(case)
    print(result.line(), flush=True)
    lowered += result.ok
    failed += not result.ok
  print(f"{label}{lowered} lowered, {failed} failed ({lowered + failed} cases, "
        f"jax {jax.__version__}, "
        f"{time.perf_counter() - start:.0f}s)")
  return failed


if __name__ == "__main__":
  sys.exit(main())
