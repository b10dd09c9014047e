"""The Pallas kernels lower ahead of time for TPU (Mosaic) and GPU (Triton) from this CPU host.

kernels_pallas.lower_check exports each kernel with jax.export for platforms=["tpu"] and
["cuda"]: that runs the target's Pallas lowering (its block-shape rules included) without the
hardware. Here: the --fast subset (decode and prefill, SmolLM2's H9/KV3 D64 and Llama-3-8B's
H32/KV8 D128, both targets) lowers to the target's own custom call; a deliberately unsupported
block shape fails with the target's own message (so the check can fail); the command runs and
exits 0, and non-zero when a case fails. The TPU prefill kernel's fix for GQA 3 (lax.div
instead of `//`, whose lax.sign lowering asked the local device for its TPU generation, so
SmolLM2's heads could not lower from a CPU host) is checked for arithmetic in interpret mode.
"""

import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

import kernels_pallas
from helpers.kernel_cases import TOLERANCE, ragged_case
from helpers.paths import ROOT
from kernels_pallas import lower_check
from kernels_pallas.lower_check import Case

FAST = lower_check.grid(fast=True)

MOSAIC_BLOCK_RULE = ("ValueError: The Pallas TPU lowering currently requires that the last two "
                     "dimensions of your block shape are divisible by 8 and 128 respectively, or "
                     "be equal to the respective dimensions of the overall array.")
TRITON_POW2_RULE = ("ValueError: The Pallas Triton lowering currently requires that all "
                    "operations have array arguments and results whose size is a power of 2. "
                    "Encountered an array of shape (8, 24, 64)")


def test_fast_subset_covers_both_kernels_targets_and_model_heads():
  got = {(c.target, c.kernel, c.num_heads, c.num_kv_heads, c.head_dim) for c in FAST}
  assert got == {(t, k, h, kv, d) for t in ("tpu", "cuda") for k in ("decode", "prefill")
                 for h, kv, d in ((9, 3, 64), (32, 8, 128))}


@pytest.mark.parametrize("case", FAST, ids=[c.label().replace(" ", "-") for c in FAST])
def test_kernel_lowers_to_the_targets_custom_call(case):
  result = lower_check.lower(case)
  assert result.ok, result.message
  assert result.message == {"tpu": "tpu_custom_call", "cuda": "__gpu$xla.gpu.triton"}[case.target]


def test_full_grid_shape():
  """324 cases: decode 2 dtypes x 6 head shapes x 3 pages x 3 blocks per target, the TPU
  prefill 2 q_blocks, the GPU prefill (no block choice) 1."""
  cases = lower_check.grid()
  assert len(cases) == len(set(cases)) == 108 * 2 + 72 + 36
  assert {c.page_size for c in cases} == {16, 32, 64}
  assert {c.head_dim for c in cases} == {64, 128}


def test_mosaic_rejects_a_q_block_off_the_sublane_tile():
  """q_block 3 x GQA 4 = 12 rows per q block: not a multiple of 8, not the whole array."""
  result = lower_check.lower(Case("tpu", "prefill", "bf16", 32, 8, 128, 16, block=3))
  assert not result.ok
  assert result.message.startswith(MOSAIC_BLOCK_RULE), result.message
  assert "block shape (Squeezed(), Blocked(block_size=12), Blocked(block_size=128))" in (
      result.message)
  assert result.line().startswith("FAIL  tpu  prefill bf16 H32/KV8 D128 page16 q_block=3  ")


def test_triton_rejects_a_kv_block_that_is_not_a_power_of_two():
  """24-token pages: the GPU decode kernel gathers [pages, 24, head_dim] blocks."""
  result = lower_check.lower(Case("cuda", "decode", "bf16", 9, 3, 64, 24))
  assert not result.ok
  assert result.message == TRITON_POW2_RULE


def test_a_fallback_without_the_custom_call_is_not_ok(monkeypatch):
  """"ok" means the target's Pallas lowering ran: the XLA attention in the kernel's place
  exports fine, but with no Triton call the case fails."""
  monkeypatch.setattr(lower_check, "kernel_fn",
                      lambda case: kernels_pallas.ragged_paged_attention_xla)
  result = lower_check.lower(Case("cuda", "prefill", "bf16", 9, 3, 64, 16))
  assert not result.ok
  assert result.message == "no __gpu$xla.gpu.triton custom call in the exported module"


def test_tpu_prefill_at_gqa3_matches_the_reference_in_interpret_mode():
  """SmolLM2's GQA 3 takes the kernel's non-power-of-two row -> token division (lax.div)."""
  args = ragged_case(5, q_lens=[1, 17, 6], kv_lens=[17, 40, 6], page_size=16, head_dim=64,
                     num_kv_heads=3, gqa=3, dtype=jnp.float32, max_seqs=4, pad_tokens=5)
  out = kernels_pallas.ragged_paged_attention(*args, interpret=True, variant="tpu")
  ref = kernels_pallas.ragged_paged_attention_reference(*args)
  np.testing.assert_allclose(np.asarray(out), np.asarray(ref), **TOLERANCE[jnp.float32])
  np.testing.assert_array_equal(np.asarray(out[-5:]), 0.0)


def test_main_exits_nonzero_when_a_case_fails(monkeypatch, capsys):
  bad = Case("cuda", "decode", "bf16", 9, 3, 64, 24)
  monkeypatch.setattr(lower_check, "grid", lambda *a, **k: [bad])
  assert lower_check.main([]) == 1
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines[0].startswith("FAIL  cuda decode  bf16 H9/KV3 D64 page24 ppcb=default  "
                             "ValueError: The Pallas Triton lowering")
  assert lines[1].startswith("0 lowered, 1 failed (1 cases, jax ")


def test_command_fast_exits_zero_with_its_summary():
  proc = subprocess.run([sys.executable, "-m", "kernels_pallas.lower_check", "--fast"],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  lines = proc.stdout.strip().splitlines()
  assert len(lines) == 9
  assert all(line.startswith("ok    ") for line in lines[:8]), proc.stdout
  assert lines[-1].startswith("8 lowered, 0 failed (8 cases, jax ")


def test_bad_flag_is_a_usage_error(capsys):
  with pytest.raises(SystemExit) as e:
    lower_check.main(["--targets", "rocm"])
  assert e.value.code == 2
  assert "expected a comma list of ('tpu', 'cuda'), got 'rocm'" in capsys.readouterr().err
