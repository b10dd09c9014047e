"""The engine's own programs (prefill, decode with the Pallas attention, the KV gather and
scatter) export for TPU and GPU from this CPU host, at real model shapes, on an AbstractMesh of
the instance's TP: pdjax.engine.program_export and `python -m pdjax.lower_check`."""

import dataclasses
import subprocess
import sys

import jax
from jax import export
from jax.sharding import AbstractMesh

from helpers.paths import ROOT
from kernels_pallas.attention_ops import AttentionOps
from pdjax.engine import mesh as mesh_lib
from pdjax.engine import program_export as pe
from pdjax.engine import programs, transfer

LLAMA, SMOL = pe.BUILTIN["llama3_8b"], pe.BUILTIN["smollm2_135m"]
KV_OK = "devices, KV sharded by kv heads; KV donated"


def _lower(model, target, program, tp, n, dst_tp=None):
  return pe.lower(pe.ProgramCase(model, target, program, tp, n, dst_tp))


def test_llama3_8b_decode_at_tp8_lowers_for_both_targets():
  """One engine decode program (batch 64, 8k context, bfloat16): each device's kernel call
  takes its own kv head of the 16,384-page pools."""
  tpu = _lower(LLAMA, "tpu", "decode", 8, 64)
  cuda = _lower(LLAMA, "cuda", "decode", 8, 64)
  assert (tpu.ok, tpu.message) == (
      True, f"tpu_custom_call, kernel KV 1x16384x16x128xbf16; 8 {KV_OK}")
  assert (cuda.ok, cuda.message) == (
      True, f"__gpu$xla.gpu.triton, kernel KV 1x16384x16x128xbf16; 8 {KV_OK}")
  assert tpu.line().startswith("ok    tpu  llama3_8b tp8 decode  batch 64  tpu_custom_call")


def test_smollm2_prefill_at_tp3_lowers_for_tpu():
  """GQA 3, head_dim 64 (the shape whose TPU prefill lowering used to ask for the device kind),
  one kv head per device, float32 as configs/smollm2.py serves it."""
  result = _lower(SMOL, "tpu", "prefill", 3, 1024)
  assert (result.ok, result.message) == (
      True, f"tpu_custom_call, kernel KV 1x512x16x64xf32; 3 {KV_OK}")


def test_transfer_programs_lower_between_tp_degrees():
  gather_down = _lower(LLAMA, "tpu", "gather", 8, 512, dst_tp=1)
  gather_up = _lower(LLAMA, "cuda", "gather", 1, 1, dst_tp=8)
  scatter = _lower(LLAMA, "tpu", "scatter", 8, 512)
  assert (gather_down.ok, gather_down.message) == (True, "8 devices, KV sharded by kv heads")
  assert (gather_up.ok, gather_up.message) == (True, "1 device, KV sharded by kv heads")
  assert (scatter.ok, scatter.message) == (True, f"8 {KV_OK}")


def test_a_gather_between_tp_degrees_that_do_not_divide_fails():
  result = _lower(LLAMA, "tpu", "gather", 8, 1, dst_tp=3)
  assert (result.ok, result.message) == (
      False, "ValueError: cannot move KV from TP8 to TP3: neither divides the other")


def test_a_page_size_triton_cannot_block_fails_with_tritons_message():
  """24-token pages: the engine's decode step reaches the GPU kernel, whose Triton lowering
  refuses a block that is not a power of two."""
  model = dataclasses.replace(SMOL, opts=dataclasses.replace(SMOL.opts, page_size=24))
  result = _lower(model, "cuda", "decode", 1, 16)
  assert not result.ok
  assert result.message.startswith(
      "ValueError: The Pallas Triton lowering currently requires that all operations have "
      "array arguments and results whose size is a power of 2."), result.message


def test_a_step_without_the_pallas_call_is_not_ok(monkeypatch):
  """The XLA attention in the Pallas kernels' place exports fine, but is not what runs on an
  accelerator: the case fails."""
  monkeypatch.setattr(pe, "AttentionOps",
                      lambda impl, mesh, variant: AttentionOps(impl="xla", mesh=mesh))
  result = _lower(SMOL, "cuda", "decode", 1, 16)
  assert (result.ok, result.message) == (
      False, "no __gpu$xla.gpu.triton custom call: the Pallas attention was not lowered")


def test_a_scatter_that_does_not_donate_the_pools_is_not_ok():
  case = pe.ProgramCase(SMOL, "tpu", "scatter", 1, 1)
  _, args, kv_at = pe._jitted(case)
  in_sh, out_sh = transfer.scatter_shardings(AbstractMesh((1,), (mesh_lib.TP_AXIS,)))
  kept = jax.jit(programs.scatter_pages, in_shardings=in_sh, out_shardings=out_sh)
  assert pe.check(case, export.export(kept, platforms=["tpu"])(*args), kv_at) == (
      False, "the KV pools are not donated (no aliasing of both pools to outputs)")


def test_cases_cover_every_bucket_and_transfer_direction():
  got = [c.label() for c in pe.cases([SMOL], ("tpu",))]
  assert got == [
      "tpu  smollm2_135m tp1 prefill 1024 tokens", "tpu  smollm2_135m tp1 decode  batch 16",
      "tpu  smollm2_135m tp1 gather  1 pages to tp1", "tpu  smollm2_135m tp1 gather  64 pages to tp1",
      "tpu  smollm2_135m tp1 gather  1 pages to tp3", "tpu  smollm2_135m tp1 gather  64 pages to tp3",
      "tpu  smollm2_135m tp1 scatter 1 pages", "tpu  smollm2_135m tp1 scatter 64 pages",
      "tpu  smollm2_135m tp3 prefill 1024 tokens", "tpu  smollm2_135m tp3 decode  batch 16",
      "tpu  smollm2_135m tp3 gather  1 pages to tp1", "tpu  smollm2_135m tp3 gather  64 pages to tp1",
      "tpu  smollm2_135m tp3 gather  1 pages to tp3", "tpu  smollm2_135m tp3 gather  64 pages to tp3",
      "tpu  smollm2_135m tp3 scatter 1 pages", "tpu  smollm2_135m tp3 scatter 64 pages"]


def test_shape_from_a_run_config():
  """configs/smollm2.py: its buckets, the chunked run's ragged rows (16 decodes + 1 chunk),
  its tiers' TP 1, and the Pallas attention whatever the config says."""
  from pdjax.config import load_config_module
  cfg = load_config_module(str(ROOT / "pdjax" / "configs" / "smollm2.py")).get_config()
  cfg.model.checkpoint = ""
  cfg.model.preset = "smollm2_135m"
  shape = pe.shape_from_config(cfg, "smollm2.py")
  o = shape.opts
  assert (shape.tps, o.prefill_buckets, o.decode_buckets, o.max_prefill_seqs, o.page_size,
          o.num_pages, o.max_model_len, o.attention_impl) == (
              (1,), (128, 512, 1024), (4, 8, 16), 17, 16, 512, 1024, "pallas")


def test_the_command_lowers_and_says_what_it_does_not_export():
  proc = subprocess.run(
      [sys.executable, "-m", "pdjax.lower_check", "--models=smollm2_135m", "--programs=decode",
       "--targets=cuda", "--kernels=none"], cwd=ROOT, capture_output=True, text=True,
      timeout=300)
  lines = proc.stdout.splitlines()
  assert proc.returncode == 0, proc.stderr
  assert [line.rsplit(" (", 1)[0] for line in lines[:2]] == [
      "ok    cuda smollm2_135m tp1 decode  batch 16  __gpu$xla.gpu.triton, kernel KV "
      "3x512x16x64xf32; 1 device, KV sharded by kv heads; KV donated",
      "ok    cuda smollm2_135m tp3 decode  batch 16  __gpu$xla.gpu.triton, kernel KV "
      "1x512x16x64xf32; 3 devices, KV sharded by kv heads; KV donated"]
  assert lines[2:5] == [f"not exported: {why}" for why in pe.NOT_EXPORTED]
  assert lines[5].startswith(f"engine programs: 2 lowered, 0 failed (2 cases, jax "
                             f"{jax.__version__}, host cpu, ")
  assert len(lines) == 6


def test_the_command_refuses_an_unknown_target_in_one_line():
  proc = subprocess.run([sys.executable, "-m", "pdjax.lower_check", "--targets=gpu"], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)
  assert (proc.returncode, proc.stdout) == (2, "")
  assert proc.stderr == "--targets: expected a comma list of ['tpu', 'cuda'], got 'gpu'\n"
