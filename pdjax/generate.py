"""Offline generation from a local Hugging Face checkpoint, through the serving engine.

  python -m pdjax.generate --checkpoint=DIR --prompts=IN.jsonl --max_new_tokens=N \
      --output=OUT.jsonl [--mode=colocated|chunked|disaggregated] [--temperature=T] \
      [--ignore_eos] [--tokenizer=DIR]

IN lines are {"id": "...", and one of "prompt_ids": [...], "prompt": "text" or "messages":
[{"role": "user", "content": "..."}]} with an optional integer "seed" (the request's sampling
seed; default: derived from its id). Text is encoded with the tokenizer of --tokenizer (default:
the checkpoint folder), chats rendered with its chat template; generation stops at the EOS ids
of generation_config.json. OUT lines {"id", "output_ids", "text", "finish_reason": "stop" |
"length"} in input order; a request that was not served also has "status" and "reason" (and
one line on stderr). Greedy when temperature is 0; sampled tokens depend only on --seed, the
request's seed and the position, not on batching. All prompts arrive at t=0 and are served with
the same driver, programs and KV transfer as `pdjax.run`. Each step bucket is compiled on its
first use (--nolazy_compile: all before serving). Prints the host overhead per tier and, last,
`generated N tokens for M prompts in S s: R tok/s` (steady state: the serving loop less the
compiles inside it; the whole process is benchmarks/offline_throughput.py's other figure).
"""

from __future__ import annotations

import dataclasses
import json
import sys

from absl import app, flags, logging

from pdjax.cli import fail, parse_flags, use_cpu_devices
from pdjax.runner.build import generate_policies
from pdjax.text.stops import load_text

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Local HF checkpoint folder.")
_TOKENIZER = flags.DEFINE_string("tokenizer", "", "Tokenizer folder; empty = --checkpoint.")
_PROMPTS = flags.DEFINE_string("prompts", None, "Input JSONL: id + prompt_ids|prompt|messages.")
_OUTPUT = flags.DEFINE_string("output", None, "Output JSONL: id, output_ids, text, "
                              "finish_reason.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 16, "Tokens to generate per prompt.")
_MODE = flags.DEFINE_enum("mode", "colocated", ["colocated", "chunked", "disaggregated"],
                          "Serving mode (chunked: colocated with chunked prefill).")
_CHUNK = flags.DEFINE_integer("chunk_budget", 64, "Tokens per chunked-prefill step.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Sampling temperature; 0 is greedy.")
_IGNORE_EOS = flags.DEFINE_boolean("ignore_eos", False, "Generate max_new_tokens regardless.")
_TP = flags.DEFINE_integer("tp", 1, "TP of the colocated instance.")
_PREFILL_TP = flags.DEFINE_integer("prefill_tp", 1, "TP of the prefill instance.")
_DECODE_TP = flags.DEFINE_integer("decode_tp", 1, "TP of the decode instance.")
_PAGE_SIZE = flags.DEFINE_integer("page_size", 16, "Tokens per KV page.")
_MAX_BATCH = flags.DEFINE_integer("max_batch", 16, "Sequences per decode step.")
_CONTEXT = flags.DEFINE_integer("max_model_len", 0, "Most tokens per request, prompt + "
                                "generated; 0 = the model's max_position_embeddings.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute dtype.")
_CACHE = flags.DEFINE_string("compile_cache_dir", "~/.cache/pdjax/xla",
                             "JAX persistent compilation cache; empty = off.")
_ATTENTION = flags.DEFINE_enum("attention_impl", "auto", ["auto", "pallas", "xla"],
                               "Paged attention: auto = Pallas on TPU/GPU, XLA on CPU.")
_LAYOUT = flags.DEFINE_enum("param_layout", "auto", ["auto", "stacked", "unrolled"],
                            "Parameter layout (model.param_layout): auto = unrolled for a CPU "
                            "TP1 instance (faster steps, slower compiles), else stacked.")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_LAZY = flags.DEFINE_boolean("lazy_compile", True, "Compile each step bucket on its first use "
                             "(only the buckets the batches need); --nolazy_compile compiles "
                             "every bucket before serving.")
_OVERLAP = flags.DEFINE_enum("overlap", "auto", ["auto", "on", "off"],
                             "Dispatch the next step before a decode step's tokens reach the "
                             "host: auto = on for TPU/GPU, off on CPU (see "
                             "runner/serve_requests.py).")


PREFILL_SEQS = 4             # whole prompts per prefill step (prefill_first)
MAX_PREFILL_TOKENS = 2048    # the largest prefill bucket packs prompts up to this many tokens


def output_row(r, tokenizer) -> dict:
  """One OUT line: text leaves out the stop token that ended the request."""
  ids = r.output_ids[:-1] if r.finish_reason == "stop" else r.output_ids
  row = {"id": r.id, "output_ids": r.output_ids,
         "text": tokenizer.decode(ids) if tokenizer is not None else None,
         "finish_reason": r.finish_reason}
  if r.status.value != "finished":
    row.update(status=r.status.value, reason=r.reason)
  return row


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
  if _MAX_NEW.value < 1 or _CHUNK.value < 1 or _CONTEXT.value < 0:
    fail("error: --max_new_tokens and --chunk_budget must be >= 1, --max_model_len >= 0")
  from pdjax.models.llama_config import config_from_hf
  from pdjax.text.prompts import read_prompts
  try:
    mcfg = config_from_hf(_CHECKPOINT.value)
    tokenizer, no_tokenizer, stop_ids = load_text(_CHECKPOINT.value, _TOKENIZER.value, mcfg)
    context = _CONTEXT.value or mcfg.max_position_embeddings
    prompts = read_prompts(_PROMPTS.value, mcfg.vocab_size, tokenizer=tokenizer,
                           no_tokenizer=no_tokenizer, context=context,
                           max_new_tokens=_MAX_NEW.value)
  except (ValueError, FileNotFoundError) as e:   # TextError is a ValueError
    fail(f"error: {e}")
  use_cpu_devices(8)
  from pdjax.runner import serve_requests
  from pdjax.engine.cluster import build_instances, enable_compile_cache, host_params
  from pdjax.engine.options import EngineOptions
  from pdjax.metrics.host_time import host_overhead
  from pdjax.request import Request, SamplingParams, Status

  sampling = SamplingParams(temperature=_TEMPERATURE.value, max_new_tokens=_MAX_NEW.value,
                            ignore_eos=_IGNORE_EOS.value)
  requests = [Request(id=p.id, arrival_s=0.0, prompt_ids=p.ids,
                      sampling=dataclasses.replace(sampling, seed=p.seed), eos_ids=stop_ids)
              for p in prompts]
  for p, r in zip(prompts, requests):
    if p.error:
      r.finish(Status.REJECTED, 0.0, p.error)
  served = [r for r in requests if not r.status.terminal]
  duration = 0.0
  if served:
    enable_compile_cache(_CACHE.value)
    max_prompt = max(len(r.prompt_ids) for r in served)
    page = _PAGE_SIZE.value
    max_model_len = -(-(max_prompt + _MAX_NEW.value) // page) * page
    batch = min(_MAX_BATCH.value, len(served))
    chunked = _MODE.value == "chunked"
    # prefill_first packs up to PREFILL_SEQS whole prompts into a step: the largest bucket
    # holds that many of the longest prompt (within MAX_PREFILL_TOKENS).
    packed = min(max_prompt * PREFILL_SEQS, max(MAX_PREFILL_TOKENS, max_prompt))
    opts = EngineOptions(
        page_size=page, num_pages=(max_model_len // page) * batch + 1,
        max_model_len=max_model_len,
        prefill_buckets=_powers_of_two_up_to(_CHUNK.value if chunked else packed, 16),
        max_prefill_seqs=batch + 1 if chunked else PREFILL_SEQS,
        decode_buckets=_powers_of_two_up_to(batch, 1), dtype=_DTYPE.value, seed=_SEED.value,
        attention_impl=_ATTENTION.value, param_layout=_LAYOUT.value, lazy_compile=_LAZY.value)
    tiers = ([("prefill", 1, _PREFILL_TP.value), ("decode", 1, _DECODE_TP.value)]
             if _MODE.value == "disaggregated" else [("colocated", 1, _TP.value)])
    try:   # a checkpoint missing a tensor (KeyError) or holding a stray one (ValueError)
      params = host_params(mcfg, checkpoint=_CHECKPOINT.value, seed=_SEED.value,
                           dtype=_DTYPE.value)
    except (KeyError, ValueError) as e:
      fail(f"error: {e.args[0]}")
    instances = build_instances(tiers, mcfg, params, opts)
    mode = "disaggregated" if _MODE.value == "disaggregated" else "colocated"
    result = serve_requests.serve(mode, instances, served, overlap=_OVERLAP.value,
                                  policies=generate_policies(_MODE.value, opts, _CHUNK.value))
    overhead = host_overhead(result.steps)
    by_id = {r.id: r for r in result.requests}
    requests = [by_id.get(r.id, r) for r in requests]
    # steady state: the serving loop, less the buckets compiled on their first use in it
    duration = result.duration_s - sum(i.lazy_compile_s for i in instances)
  with open(_OUTPUT.value, "w") as f:
    for r in requests:
      f.write(json.dumps(output_row(r, tokenizer)) + "\n")
      if r.status is not Status.FINISHED:
        print(f"request {r.id}: {r.status.value}: {r.reason}", file=sys.stderr)
  generated = sum(len(r.output_ids) for r in requests)
  if served:
    print("host overhead (devices idle waiting for the host): " + ", ".join(
        f"{role} {share * 100:.1f}%" for role, share in overhead.items() if share is not None))
  print(f"generated {generated} tokens for {len(requests)} prompts in {duration:.2f} s: "
        f"{generated / max(duration, 1e-9):.1f} tok/s")


def entry_point() -> None:
  app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
  entry_point()
