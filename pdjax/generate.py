"""Offline generation from a local Hugging Face checkpoint, through the serving engine.

  python -m pdjax.generate --checkpoint=DIR --prompts=IN.jsonl --max_new_tokens=N \
      --output=OUT.jsonl [--mode=colocated|disaggregated] [--temperature=T] [--ignore_eos]

IN lines are {"id": "...", "prompt_ids": [...]} with an optional integer "seed" (the request's
sampling seed; default: derived from its id); OUT lines {"id": "...", "output_ids": [...]}
in input order. Greedy when temperature is 0; sampled tokens depend only on --seed, the
request's seed and the position, not on batching. All prompts arrive at t=0 and are served with
the same driver, programs and KV transfer as `pdjax.run`. Prints generated tokens per second.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from absl import app, flags, logging

from pdjax.cli import fail, use_cpu_devices

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Local HF checkpoint folder.")
_PROMPTS = flags.DEFINE_string("prompts", None, "Input JSONL: id, prompt_ids.")
_OUTPUT = flags.DEFINE_string("output", None, "Output JSONL: id, output_ids.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 16, "Tokens to generate per prompt.")
_MODE = flags.DEFINE_enum("mode", "colocated", ["colocated", "disaggregated"], "Serving mode.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Sampling temperature; 0 is greedy.")
_IGNORE_EOS = flags.DEFINE_boolean("ignore_eos", False, "Generate max_new_tokens regardless.")
_TP = flags.DEFINE_integer("tp", 1, "TP of the colocated instance.")
_PREFILL_TP = flags.DEFINE_integer("prefill_tp", 1, "TP of the prefill instance.")
_DECODE_TP = flags.DEFINE_integer("decode_tp", 1, "TP of the decode instance.")
_PAGE_SIZE = flags.DEFINE_integer("page_size", 16, "Tokens per KV page.")
_MAX_BATCH = flags.DEFINE_integer("max_batch", 16, "Sequences per decode step.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute dtype.")
_CACHE = flags.DEFINE_string("compile_cache_dir", "~/.cache/pdjax/xla",
                             "JAX persistent compilation cache; empty = off.")
_ATTENTION = flags.DEFINE_enum("attention_impl", "auto", ["auto", "pallas", "xla"],
                               "Paged attention: auto = Pallas on TPU/GPU, XLA on CPU.")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")


def read_prompts(path: str, vocab_size: int) -> list[tuple[str, list[int], int | None]]:
  """(id, prompt_ids, seed or None) per non-empty line."""
  prompts = []
  with open(path) as f:
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
        ids = row["prompt_ids"]
        if not (isinstance(ids, list) and ids and
                all(isinstance(t, int) and 0 <= t < vocab_size for t in ids)):
          raise ValueError(f"prompt_ids must be a non-empty list of ints in [0, {vocab_size})")
        seed = row.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
          raise ValueError(f"seed must be an integer, got {seed!r}")
        prompts.append((str(row["id"]), ids, seed))
      except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}:{lineno}: {type(e).__name__}: {e}") from None
  return prompts


def _powers_of_two_up_to(n: int, start: int) -> tuple[int, ...]:
  out, b = [], start
  while b < n:
    out.append(b)
    b *= 2
  return tuple(out) + (b,)


def main(argv) -> None:
  del argv
  logging.set_verbosity(logging.WARNING)
  for name, flag in (("checkpoint", _CHECKPOINT), ("prompts", _PROMPTS), ("output", _OUTPUT)):
    if not flag.value:
      fail(f"--{name} is required")
  from pdjax.models.llama_config import config_from_hf
  try:
    mcfg = config_from_hf(_CHECKPOINT.value)
    prompts = read_prompts(_PROMPTS.value, mcfg.vocab_size)
  except (ValueError, FileNotFoundError) as e:
    fail(f"error: {e}")
  use_cpu_devices(8)
  from pdjax import serving
  from pdjax.engine.cluster import build_instances, enable_compile_cache, host_params
  from pdjax.engine.options import EngineOptions
  from pdjax.request import Request, SamplingParams

  enable_compile_cache(_CACHE.value)
  max_prompt = max((len(p) for _, p, _ in prompts), default=1)
  page = _PAGE_SIZE.value
  max_model_len = -(-(max_prompt + _MAX_NEW.value) // page) * page
  batch = min(_MAX_BATCH.value, max(len(prompts), 1))
  opts = EngineOptions(page_size=page, num_pages=(max_model_len // page) * batch + 1,
                       max_model_len=max_model_len,
                       prefill_buckets=_powers_of_two_up_to(max_prompt, 16),
                       max_prefill_seqs=4, decode_buckets=_powers_of_two_up_to(batch, 1),
                       dtype=_DTYPE.value, seed=_SEED.value, attention_impl=_ATTENTION.value)
  tiers = ([("colocated", 1, _TP.value)] if _MODE.value == "colocated" else
           [("prefill", 1, _PREFILL_TP.value), ("decode", 1, _DECODE_TP.value)])
  params = host_params(mcfg, checkpoint=_CHECKPOINT.value, seed=_SEED.value, dtype=_DTYPE.value)
  instances = build_instances(tiers, mcfg, params, opts)
  sampling = SamplingParams(temperature=_TEMPERATURE.value, max_new_tokens=_MAX_NEW.value,
                            ignore_eos=_IGNORE_EOS.value)
  requests = [Request(id=i, arrival_s=0.0, prompt_ids=ids,
                      sampling=dataclasses.replace(sampling, seed=seed),
                      eos_ids=mcfg.eos_token_ids) for i, ids, seed in prompts]
  result = serving.serve(_MODE.value, instances, requests)
  with open(_OUTPUT.value, "w") as f:
    for r in result.requests:
      row = {"id": r.id, "output_ids": r.output_ids}
      if r.status.value != "finished":
        row.update(status=r.status.value, reason=r.reason)
      f.write(json.dumps(row) + "\n")
  generated = sum(len(r.output_ids) for r in result.requests)
  print(f"generated {generated} tokens for {len(requests)} prompts in {result.duration_s:.2f} s: "
        f"{generated / max(result.duration_s, 1e-9):.1f} tok/s")


if __name__ == "__main__":
  app.run(main)
