"""The Flax Llama against transformers.LlamaForCausalLM, and pdjax.generate against HF generate."""

import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from conftest import make_hf_llama
from pdjax.models.hf_loader import load_hf_checkpoint
from pdjax.models.llama import Llama

PROMPTS = [[1, 5, 9, 14, 27, 3, 88], [1, 100], [1] + list(range(10, 60))]


def _hf_logits(model, ids):
  with torch.no_grad():
    return model(torch.tensor([ids])).logits[0].numpy()


def _dense_logits(cfg, params, ids):
  t = len(ids)
  logits, _ = Llama(cfg, mode="dense").apply(params, jnp.array(ids), (),
                                             {"positions": jnp.arange(t)}, jnp.arange(t))
  return np.asarray(logits)


@pytest.mark.parametrize("ids", PROMPTS)
def test_dense_logits_match_hf(hf_llama, ids):
  path, model = hf_llama
  cfg, params = load_hf_checkpoint(path)
  np.testing.assert_allclose(_dense_logits(cfg, params, ids), _hf_logits(model, ids),
                             atol=2e-5, rtol=0)


def test_sharded_and_tied_checkpoints_load(tmp_path):
  model = make_hf_llama(tmp_path, tie_word_embeddings=True, max_shard_size="60KB", seed=3)
  assert len([f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]) > 1
  cfg, params = load_hf_checkpoint(str(tmp_path))
  assert cfg.tie_word_embeddings and "lm_head" not in params["params"]
  ids = PROMPTS[0]
  np.testing.assert_allclose(_dense_logits(cfg, params, ids), _hf_logits(model, ids),
                             atol=2e-5, rtol=0)


def test_paged_prefill_logits_match_dense(hf_llama):
  """The prefill mode (ragged batch over pages) gives the dense logits at each last token."""
  from pdjax.engine import batch as batch_lib
  path, _ = hf_llama
  cfg, params = load_hf_checkpoint(path)
  geom = batch_lib.PageGeometry(num_pages=20, page_size=8, pages_per_seq=8)
  seqs = [(PROMPTS[0], 0, [3], 0.0, 0), (PROMPTS[2], 0, [11, 4, 7, 0, 9, 12, 2], 0.0, 0)]
  b = batch_lib.prefill_batch(geom, seqs, num_tokens=64, max_seqs=4)
  pool = jnp.zeros((cfg.num_layers, cfg.num_kv_heads, 20, 8, cfg.head_dim))
  meta = {k: jnp.asarray(v) for k, v in b.items()}
  logits, _ = Llama(cfg, mode="prefill").apply(params, meta["tokens"], (pool, pool), meta,
                                               meta["cu_q_lens"][1:3] - 1)
  for row, (ids, *_) in enumerate(seqs):
    np.testing.assert_allclose(np.asarray(logits[row]), _dense_logits(cfg, params, ids)[-1],
                               atol=2e-5, rtol=0)


@pytest.mark.parametrize("mode", ["colocated", pytest.param("disaggregated",
                                                             marks=pytest.mark.slow)])
def test_generate_cli_matches_hf_greedy(hf_llama, tmp_path, mode):
  path, model = hf_llama
  prompts = tmp_path / "in.jsonl"
  prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt_ids": ids}) + "\n"
                             for i, ids in enumerate(PROMPTS)))
  out = tmp_path / "out.jsonl"
  proc = subprocess.run(
      [sys.executable, "-m", "pdjax.generate", f"--checkpoint={path}", f"--prompts={prompts}",
       "--max_new_tokens=12", f"--output={out}", f"--mode={mode}", "--decode_tp=2",
       f"--compile_cache_dir={os.environ['PDJAX_TEST_COMPILE_CACHE']}"],
      capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "tok/s" in proc.stdout
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert [r["id"] for r in rows] == ["p0", "p1", "p2"]
  for row, ids in zip(rows, PROMPTS):
    with torch.no_grad():
      hf = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                          eos_token_id=2, pad_token_id=0)[0, len(ids):].tolist()
    assert row["output_ids"] == hf


def test_generate_cli_rejects_bad_prompt_line(hf_llama, tmp_path):
  path, _ = hf_llama
  prompts = tmp_path / "in.jsonl"
  prompts.write_text('{"id": "a", "prompt_ids": [1, 2]}\n{"id": "b", "prompt_ids": [1, 999]}\n')
  proc = subprocess.run(
      [sys.executable, "-m", "pdjax.generate", f"--checkpoint={path}", f"--prompts={prompts}",
       f"--output={tmp_path / 'o.jsonl'}"], capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2
  assert proc.stderr.strip() == (
      f"error: {prompts}:2: ValueError: prompt_ids must be a non-empty list of ints in [0, 128)")
