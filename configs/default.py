"""The embedded default: colocated vs disaggregated on 8 virtual CPU devices, tiny Llama.

Run:   python -m pdjax.run                      (same as --config=configs/default.py)
Smoke: python -m pdjax.run --config=configs/default.py:smoke   (a few requests, for tests)

Colocated: 4 instances x TP2. Disaggregated: 2 prefill x TP2 + 2 decode x TP2. Same seeded
workload for both: Poisson arrivals mixing short chat requests with long document requests.
Expect a side-by-side table; on a 2-core CPU the whole run takes about a minute.
"""

import ml_collections


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.mode = "compare"                       # colocated | disaggregated | compare
  c.seed = 0
  c.num_cpu_devices = 8                    # virtual devices when the platform is CPU
  c.compile_cache_dir = "~/.cache/pdjax/xla"   # JAX persistent compilation cache; "" = off

  c.model = ml_collections.ConfigDict()
  c.model.preset = "tiny"                  # used when model.checkpoint is empty
  c.model.checkpoint = ""                  # local Hugging Face folder (config.json + safetensors)
  c.model.dtype = "float32"                # float32 | bfloat16
  c.model.attention_impl = "auto"          # auto (Pallas on TPU/GPU, XLA on CPU) | pallas | xla

  c.cluster = ml_collections.ConfigDict()
  c.cluster.prefill = ml_collections.ConfigDict(dict(instances=2, tp=2))
  c.cluster.decode = ml_collections.ConfigDict(dict(instances=2, tp=2))
  c.cluster.colocated = ml_collections.ConfigDict(dict(instances=4, tp=2))

  c.kv = ml_collections.ConfigDict()
  c.kv.page_size = 16
  c.kv.pages_per_instance = 256
  c.kv.max_model_len = 512                 # prompt + generated tokens per sequence

  c.scheduler = ml_collections.ConfigDict()
  c.scheduler.prefill_buckets = (64, 128, 256, 512)   # packed prompt tokens per prefill step
  c.scheduler.max_prefill_seqs = 4
  c.scheduler.decode_buckets = (4, 8, 16)             # sequences per decode step

  c.workload = ml_collections.ConfigDict()
  c.workload.kind = "synthetic"
  c.workload.num_requests = 64
  c.workload.rate = 8.0                    # requests per second (Poisson)
  c.workload.chat_fraction = 0.75
  c.workload.chat_prompt_len = (16, 64)
  c.workload.chat_max_new_tokens = (16, 48)
  c.workload.doc_prompt_len = (192, 448)
  c.workload.doc_max_new_tokens = (8, 24)
  c.workload.ignore_eos = False

  c.sampling = ml_collections.ConfigDict(dict(temperature=0.0))
  c.slo = ml_collections.ConfigDict(dict(ttft_s=1.0, tpot_s=0.1))
  c.progress = True

  if arg == "smoke":
    c.workload.num_requests = 8
    c.workload.rate = 20.0
    c.scheduler.prefill_buckets = (64, 512)
    c.scheduler.decode_buckets = (4, 16)
  elif arg:
    raise ValueError(f"unknown variant {arg!r} (known: smoke)")
  return c
