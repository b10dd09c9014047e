"""The embedded default: colocated vs disaggregated on 8 virtual CPU devices, tiny Llama.

Run:   python -m pdjax.run                      (same as --config=configs/default.py)
Smoke: python -m pdjax.run --config=configs/default.py:smoke   (a few requests, for tests)

Colocated: 4 instances x TP2, once with prefill_first and once with chunked prefill ("chunked").
Disaggregated: 2 prefill x TP2 + 2 decode x TP2. Same seeded workload for all three: Poisson
arrivals mixing short chat requests with long document requests.
Each run 5 times (seeds 0..4). Expect a side-by-side table of mean ± 95% interval and
compare.md's conclusion: disaggregation protects the chats' TPOT from the documents' prefills
(TPOT p99, SLO attainment) and pays a KV transfer; the command takes a few minutes on a
2-core CPU (README.md has its output).
This file ships with the package (pdjax/configs/default.py); configs/default.py in a clone
re-exports it.
"""

import ml_collections

from pdjax.workload.loader import default_workload_config


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.mode = "compare"                       # colocated | disaggregated | hybrid | compare (all
                                           # three: colocated, chunked, disaggregated) |
                                           # compare_all (the three and hybrid)
  c.seed = 0                               # seeds the workload, random weights, routers, faults
  c.repeats = 5                            # each run N times, seeds seed..seed+N-1: tables show
                                           #   mean ± 95% interval (N >= 2); absent: 1
  c.backend = "jax"                        # jax (real engine) | sim (cost model, virtual clock)
  c.num_cpu_devices = 8                    # virtual devices when the platform is CPU
  c.compile_cache_dir = "~/.cache/pdjax/xla"   # JAX persistent compilation cache; "" = off

  c.model = ml_collections.ConfigDict()
  c.model.preset = "tiny"                  # used when model.checkpoint is empty
  c.model.checkpoint = ""                  # local Hugging Face folder (config.json + safetensors)
  c.model.tokenizer = ""                   # folder with tokenizer.json; "" = model.checkpoint
  c.model.dtype = "float32"                # float32 | bfloat16
  c.model.attention_impl = "auto"          # auto (Pallas on TPU/GPU, XLA on CPU) | pallas | xla
  c.model.param_layout = "auto"            # auto (unrolled on a CPU TP1 instance, else
                                           # stacked) | stacked | unrolled: docs/guide.md

  c.cluster = ml_collections.ConfigDict()
  c.cluster.prefill = ml_collections.ConfigDict(dict(instances=2, tp=2, kv_pages=0, hosts=1))
  c.cluster.decode = ml_collections.ConfigDict(dict(instances=2, tp=2, kv_pages=0, hosts=1))
  c.cluster.colocated = ml_collections.ConfigDict(dict(instances=4, tp=2, kv_pages=0, hosts=1))
  c.cluster.p_heavy = ml_collections.ConfigDict(dict(instances=2, tp=2, kv_pages=0, hosts=1,
                                                     chunk_budget=512))
  c.cluster.d_heavy = ml_collections.ConfigDict(dict(instances=2, tp=2, kv_pages=0, hosts=1,
                                                     chunk_budget=64))
  # instances: how many instances this tier runs
  # tp: devices per instance (tensor parallelism)
  # kv_pages: this tier's KV pool per instance; 0 = kv.pages_per_instance
  # hosts: processes (hosts) one instance spans, each owning tp / hosts devices, as one
  #   multi-controller JAX group (ray launcher; the simulator prices TP collectives that cross
  #   hosts on the inter-host link): docs/guide.md "On a TPU pod or several GPU nodes"
  # chunk_budget: p_heavy, d_heavy (mode=hybrid, compare_all): instances that both prefill and
  #   decode, each step their decodes plus prompt chunks of up to this many tokens: large on
  #   P-heavy, small on D-heavy (docs/guide.md "Instances that both prefill and decode")
  c.cluster.launcher = "local"             # local (one process) | ray (a process per instance)
  c.cluster.ray_address = ""               # ray: "" = start a local Ray; else join this cluster
  c.cluster.ray_accelerator = "auto"       # ray: devices per actor: auto (the driver's backend)
                                           #   | cpu (tp virtual devices) | gpu | tpu
  c.cluster.transfer_host = "127.0.0.1"    # ray: where the KV transfer servers listen
                                           #   ("node": each actor's node address, multi-host)
  c.cluster.pull_timeout_s = 30.0          # ray: a KV pull not done by then fails (recovery)
  c.cluster.collective_timeout_s = 300.0   # ray, hosts > 1: a step or transfer of a multi-host
                                           #   instance not done by then (a collective that
                                           #   never returns) marks the instance dead (room
                                           #   for a step's lazy compile; warm-up unbounded)
  c.cluster.nodes = 1                      # nodes the instances fill in order (prefill, then
                                           #   decode): KV between nodes crosses kv.cross_node_gbps
                                           #   (ray: one Ray node each; sim: modelled)

  c.kv = ml_collections.ConfigDict()
  c.kv.page_size = 16                      # tokens per KV page
  c.kv.pages_per_instance = 512            # KV pool per instance (pages)
  c.kv.max_model_len = 1856                # prompt + generated tokens per sequence
  c.kv.prefix_cache = False                # reuse cached full pages of equal prefixes
  c.kv.cache_pages = 0                     # most pages cached per instance (0: the pool)
  c.kv.ttl_s = 0.0                         # cached pages idle longer are dropped (0: never)
  c.kv.shared_salt = ""                    # "" = per-tenant salts (no cross-tenant hits)
  c.kv.tenant_quota_pages = 0              # pages a tenant may hold per tier (0: no quota)
  c.kv.eviction = "lru"                    # idle cached pages dropped first: lru | lfu
  c.kv.flush_tenants = ""                  # "tenant@seconds,...": forget its cached pages then
  c.kv.host_tier_pages = 0                 # host-memory tier of evicted prefix pages, shared by
                                           #   the node's instances (0: off; needs prefix_cache)
  c.kv.host_tier_policy = "lru"            # host tier eviction: lru | lfu
  c.kv.host_tier_admission = "all"         # which evicted pages it takes: all | reused (hit
                                           #   on the device) | frequency (decaying count >= 2)
                                           #   | adaptive (a tenant's all while its reloads
                                           #   pay off, else frequency)
  c.kv.host_tier_half_life_s = 60.0        # frequency: a page's count halves per this idle
  c.kv.host_tier_handoff = "transfer"      # P -> D: transfer (device to device) | host (write
                                           #   the prompt's pages through the host tier)
  c.kv.remote_store = False                # a prefix in another node's host tier is reloaded
                                           #   from there when predicted faster than recomputing
  c.kv.cross_node_gbps = 100.0             # the link between nodes (Gbit/s): remote reloads and
                                           #   P -> D between nodes (sim; the engine's prediction)
  c.kv.cross_node_latency_s = 0.002        # a remote reload's round trip to the other node's
                                           #   store (Ray actor calls), in the prediction
  c.kv.seal_cross_node = False             # AES-GCM seal KV that leaves a node (P -> D between
                                           #   nodes) and every page a node store holds (at
                                           #   rest: sealed by its writer, opened by its reader)
  c.kv.seal_gbps = 24.0                    # sealing (and opening) rate per process, Gbit/s (the
                                           #   sim's and the prediction's; measured: kv_seal.py)
  c.kv.transfer_failure_policy = "retry_then_recompute"   # or "fail"
  c.kv.transfer_retries = 3                # retries of a failed KV transfer before the policy
  c.kv.transfer_backoff_s = 0.005          # first retry's delay (doubles per retry)
  c.kv.transfer_timeout_s = 0.0            # an attempt stalled longer fails (0: no timeout)
  c.kv.lease_s = 60.0                      # prefill KV no decode instance pulls: reclaimed (0: never)
  c.kv.stream_layers = 0                   # disaggregated: send a prompt's KV in this many layer
                                           #   groups while its prefill computes (0: after it)
  c.kv.stream_min_tokens = 512             # shorter prompts are sent whole after prefill

  c.scheduler = ml_collections.ConfigDict()
  c.scheduler.prefill_buckets = (128, 512, 1792)      # packed prompt tokens per prefill step
  c.scheduler.max_prefill_seqs = 4                    # most sequences per prefill step
  c.scheduler.decode_buckets = (4, 8, 16)             # sequences per decode step
  c.scheduler.prefill_router = "least_loaded"   # round_robin|random|least_loaded|power_of_two|
  c.scheduler.decode_router = "least_loaded"    #   kv_aware|kv_aware_prefix|session_sticky|
                                                #   weighted; every policy key also takes an
                                                #   installed name or module:Attr (your own
                                                #   class; `python -m pdjax.policies` lists
                                                #   them; docs/policies.md)
  c.scheduler.prefill_scorers = "queue=2,prefix=3"   # weighted: scorer=weight,... (queue,
  c.scheduler.decode_scorers = "queue=2,prefix=3"    #   running, kv_free, prefix, session,
                                                #   transfer, or module:Attr); highest sum wins
  c.scheduler.policy_args = ml_collections.ConfigDict()   # extra keyword arguments for your
                                                #   own policies (each gets those it accepts)
  c.scheduler.path = "always_disagg"            # always_disagg|always_colocated|length_hybrid|
                                                #   load_hybrid|prefix_hybrid|isl_bounding|
                                                #   slo_headroom|taichi (mode=hybrid: taichi,
                                                #   always_colocated or always_disagg)
  c.scheduler.admission = "none"                # none|queue_bound|predicted_slo
  c.scheduler.colocated_policy = "prefill_first"   # prefill_first|chunked_prefill (mode=colocated)
  c.scheduler.local_prefill = "whole"           # disaggregated: a prompt a path policy keeps on
                                                #   its decode instance runs whole (stalls the
                                                #   batch) | chunked (chunk_budget per step,
                                                #   with the decode rows)
  c.scheduler.role_switch = "none"              # none|queue_balance|remesh
  c.scheduler.chunk_budget = 256                # tokens per chunked-prefill step
  c.scheduler.overlap = "auto"                  # dispatch the next step before a decode step's
                                                #   tokens reach the host: auto (TPU/GPU on,
                                                #   CPU off) | true | false
  c.scheduler.length_threshold = 128            # length_hybrid, prefix_hybrid, isl_bounding
                                                #   (uncached part)
  c.scheduler.isl_ratio = 0.7                   # isl_bounding: local also needs the uncached
                                                #   part under this share of the prompt
  c.scheduler.latency_profile = ""              # slo_headroom on the real engine: predict step
                                                #   costs from this calibrated profile ("" =
                                                #   measured rates)
  c.scheduler.latency_feedback = -1             # slo_headroom: add to a TTFT prediction the
                                                #   median residual (measured - predicted) of
                                                #   the last N on its path and prompt size;
                                                #   0 off, -1 auto (16 on the engine, off on
                                                #   the simulator)
  c.scheduler.saturation = 0.9                  # load_hybrid: decode tier "full" at this share
  c.scheduler.admission_headroom = 1.0           # predicted_slo: admit within this x the SLO
  c.scheduler.max_queue = 32                    # queue_bound: waiting requests per instance
  c.scheduler.role_switch_interval_s = 1.0      # queue_balance: how often it looks
  c.scheduler.role_switch_queued_tokens = 1024  # queue_balance: prefill backlog per instance
  c.scheduler.remesh_schedule = ""              # remesh: scripted, e.g.
                                                #   "decode:1x2@1.5,decode:2x1@4" (at 1.5 s the
                                                #   decode tier becomes 1 instance at TP2...);
                                                #   "" = decided from the load
  c.scheduler.remesh_drain = "migrate"          # remesh: migrate (running requests' KV moves to
                                                #   the new instances) | finish (they finish first)
  c.scheduler.remesh_cooldown_s = 5.0           # remesh from the load: seconds between re-meshes

  c.workload = default_workload_config()   # kind, preset, arrival, rate, num_requests, ...
  # The default experiment: 75% short chats among long documents (1024-1792 prompt tokens):
  # a document's prefill stalls the chats decoding beside it (colocated), or runs on its own
  # tier and pays a KV transfer (disaggregated). 40 requests at 13 req/s (~3 s of arrivals a
  # run, 15 runs: the whole command in ~75 s warm on a 2-core CPU), 5 seeds.
  c.workload.num_requests = 40
  c.workload.rate = 13.0                   # requests per second (Poisson)
  c.workload.doc_prompt_len = (1024, 1792)

  c.sampling = ml_collections.ConfigDict(dict(temperature=0.0))   # temperature: 0 = greedy
  c.slo = ml_collections.ConfigDict(dict(ttft_s=0.3, tpot_s=0.005, attainment=0.9))
  # ttft_s: SLO on the time to first token (s)
  # tpot_s: SLO on the time per output token (s); a request meets the SLO when both hold
  # attainment: share of requests meeting the SLO that counts as a pass (pdjax.plan)
  c.progress = True                        # a progress bar per run on stderr
  c.output = ml_collections.ConfigDict()
  c.output.trace_steps = "auto"            # trace.json: auto (every step up to 200,000, then
                                           #   binned per instance and time) | full (every step)
  c.server = ml_collections.ConfigDict()   # python -m pdjax.serve
  c.server.max_body_bytes = 4 * 1024 * 1024   # a larger request body is refused (413)
  c.server.api_keys = ""                   # JSON file {"<key>": "<tenant>"}: each request needs
                                           #   a key (401); its tenant salts and bounds it
  c.server.metrics_public = False          # with api_keys: /metrics answers without a key too
  c.debug = False                          # invariants after every scheduler turn; jax: each greedy
                                           # output == the same request run alone (slow)

  c.faults = ml_collections.ConfigDict()   # fault injection, seeded, all off by default
  c.faults.seed = -1                       # -1: the run's seed
  c.faults.transfer_fail_prob = 0.0        # each KV transfer attempt fails with this probability
  c.faults.transfer_delay = ""             # const:S | exp:MEAN | uniform:LO:HI extra seconds
  c.faults.slow_instance = ""              # "name:factor@seconds,...": steps factor x slower
  c.faults.kill_instance = ""              # "name@seconds,...": the instance dies then
  c.faults.restart_s = 0.0                 # a killed instance is back after this (0: never)
  c.faults.cancel_prob = 0.0               # a client aborts a request with this probability
  c.faults.cancel_stages = "queued,prefill,transfer_wait,transfer,decode"   # stages a cancel hits
  c.faults.tamper_prob = 0.0               # a sealed P -> D piece between nodes has a byte
                                           #   flipped in transit (kv.seal_cross_node, ray)

  c.sim = ml_collections.ConfigDict()      # backend=sim only
  c.sim.cost_model = "roofline"            # roofline (hardware preset) | calibrated (sim.profile)
  c.sim.hardware = "h200"                  # tpu_v5e | tpu_v5p | tpu_v6e | tpu_v7x | a100 | h100 |
                                           #   h200 | b200 | mi300x, or a .json file of Hardware
                                           #   fields (your own chip: docs/policies.md)
  c.sim.link_gbps = 0.0                    # P->D link in Gbit/s; 0 = the preset's ICI/NVLink
  c.sim.profile = ""                       # calibrated profile JSON; "" = the shipped CPU one
  c.sim.host_link_gbps = 0.0               # host <-> device link (host KV tier); 0 = the preset's
  c.sim.fast_forward = True                # decode chains between events without a loop turn
                                           #   per step (identical results, faster)
  c.sim.remesh_compile_s = 1.0             # a re-meshed instance's program load (compile cache);
                                           #   a calibrated profile's measured one replaces it
  c.sim.workers = 0                        # processes for a command's runs, modes x repeats (0:
                                           #   enough to keep the cores busy, in-process under
                                           #   2,000 requests; 1: in-process); same outputs

  c.plan = ml_collections.ConfigDict()     # python -m pdjax.plan (always on the simulator)
  c.plan.chip_budget = 8                   # chips to place prefill/decode/colocated instances on
  c.plan.tp_choices = (1, 2, 4, 8)         # TP degrees to try per tier
  c.plan.num_requests = 300                # requests per simulated rate (at least)
  c.plan.min_duration_s = 0.0              # ... and at least this many seconds of arrivals
  c.plan.rate_lo = 1.0                     # req/s; the rate search starts at [lo, hi] and
  c.plan.rate_hi = 16.0                    #   doubles hi while hi still meets the SLOs
  c.plan.rel_tol = 0.05                    # bisection stops within 5% of the best rate
  c.plan.mem_util = 0.9                    # share of HBM for weights + KV (the rest: activations)
  c.plan.max_requests_per_run = 10000      # a rate needing more requests (num_requests or
                                           #   rate x min_duration_s) is not run: "not reached",
                                           #   the answer a lower bound (0: no bound)
  c.plan.map = False                       # map mode: who wins over SLOs x mixes (map_mode.py)
  c.plan.map_models = ""                   # comma-separated model presets; "" = model.preset
  c.plan.map_hardware = ""                 # comma-separated sim.hardware presets or .json
                                           #   files; "" = sim.hardware
  c.plan.map_mixes = ""                    # comma-separated planning/mixes.py names; "" = config
  c.plan.map_ttft_s = (0.25, 1.0, 4.0)     # TTFT targets (s), the map's x axis
  c.plan.map_tpot_s = (0.025, 0.1)         # TPOT targets (s), the map's y axis
  c.plan.map_rate_min = 0.0625             # req/s per chip: the rate lattice min * factor^k,
  c.plan.map_rate_max = 64.0               #   up to max; a cell reads the highest lattice rate
  c.plan.map_rate_factor = 1.4142135623730951   #   meeting it (resolution: the factor)
  c.plan.map_rate_start = 1.0              # req/s per chip where a placement's walk starts
  c.plan.map_tp_count = 2                  # the smallest N TP degrees of tp_choices that fit
  c.plan.map_full_budget = True            # only placements using all chip_budget chips
  c.plan.map_max_disagg = 0                # at most N disaggregated placements (0: all)
  c.plan.map_runs = ""                     # a previous map's DIR: re-evaluate its runs only
  c.plan.map_hybrid = ""                   # hybrid splits (decode may prefill locally) scored
                                           #   with: isl_bounding,slo_headroom ("" = none);
                                           #   instances: mode=hybrid P-heavy + D-heavy
                                           #   instances (taichi) as the kind `hybrid`
  c.plan.workers = 0                       # processes for the searches / map walks (0: one per
                                           #   core, 1: in-process); results do not depend on it

  if arg == "smoke":                       # a few requests, for tests
    c.repeats = 1
    c.workload.num_requests = 8
    c.workload.rate = 20.0
    c.workload.doc_prompt_len = (192, 448)
    c.kv.pages_per_instance = 256
    c.kv.max_model_len = 512
    c.slo.ttft_s, c.slo.tpot_s = 1.0, 0.1
    c.scheduler.prefill_buckets = (64, 512)
    c.scheduler.decode_buckets = (4, 16)
    c.scheduler.chunk_budget = 64
    c.cluster.p_heavy.chunk_budget, c.cluster.d_heavy.chunk_budget = 256, 32
  elif arg:
    raise ValueError(f"unknown variant {arg!r} (known: smoke)")
  return c
