"""Path-choice ablation: length_hybrid's threshold. A prompt shorter than it skips the prefill
tier and the KV transfer and is prefilled on the decode instance, between its decode steps.

Run:   python -m pdjax.sweep --config=configs/ablate_path.py       (the simulator; 21 s here)

Intended backend: the simulator (deterministic per seed). Llama-3-8B (bf16) on H100s
(roofline), 1 prefill + 1 decode instance at TP1 (NVLink between them), a chat + document mix:
75% chats (prompts 16-64, outputs 16-48) among documents (prompts 768-1536, outputs 8-24),
1000 requests at 70 req/s (the prefill instance ~77% busy at threshold 0), 5 seeds; SLO TTFT
250 ms / TPOT 50 ms. The thresholds follow the mix: 0 (always disaggregated), 32 (half the
chats local), 64 (every chat; 128-768 would be the same split), 1024 (the chats and a third
of the documents), 1537 (everything on the decode instance; the prefill tier idles).

Result (5 seeds, mean ± 95% half-width; "paired": the per-seed difference, beyond the noise
when its interval excludes 0):
  - TTFT p99 falls as the threshold grows (the prefill instance's queue shortens): 0: 230 ± 93
    ms, 32: 221 ± 93, 64: 180 ± 69, 1024: 107 ± 20; every step beyond the noise paired (32
    vs 0: -9 ± 5 ms, 64 vs 32: -41 ± 24, 1024 vs 64: -73 ± 53).
  - TPOT p99 rises in turn (the local prefills stall the decode batch): 8.0 ± 0.0, 10.2 ± 0.3,
    14.0 ± 0.9, 22.1 ± 4.8 ms, each beyond the noise of the one before.
  - 1537 (everything local) overloads the decode instance: TPOT p99 92.7 ± 12.2 ms, SLO
    attainment 69.8 ± 20.0% and goodput 47.4 ± 12.4 req/s, beyond the noise below every
    other threshold (-29 to -30 points of attainment paired).
  - Thresholds 0-1024 are within noise of each other on SLO attainment (98.8-100%) and
    goodput (67.6-68.6 req/s): at 250 ms / 50 ms both the TTFT won and the TPOT paid stay
    inside the SLO, so the threshold moves latency between the two and not attainment; 1024
    is the best (100.0 ± 0.0%, TTFT p99 halved).
This file ships with the package; configs/ablate_path.py in a clone re-exports it. The
`:smoke` variant is the default's smoke run (tiny model, real engine) with this sweep, for
tests.
"""

from pdjax.config import sibling_config
from pdjax.configs import simulate_published_shape

default = sibling_config(__file__)


def get_config(arg=None):
  c = default.get_config(arg)
  c.mode = "disaggregated"
  c.scheduler.path = "length_hybrid"
  if arg == "smoke":
    c.workload.num_requests = 48
    return c
  simulate_published_shape(c, "llama3_8b", "h100")
  c.cluster.prefill.instances, c.cluster.prefill.tp = 1, 1
  c.cluster.decode.instances, c.cluster.decode.tp = 1, 1
  w = c.workload
  w.preset = "mixed"
  w.chat_fraction, w.chat_prompt_len, w.chat_max_new_tokens = 0.75, (16, 64), (16, 48)
  w.doc_prompt_len, w.doc_max_new_tokens = (768, 1536), (8, 24)
  w.num_requests = 1000
  w.rate = 70.0
  c.slo.ttft_s, c.slo.tpot_s = 0.25, 0.05
  c.repeats = 5
  c.progress = False
  return c


def get_sweep():
  return [{"scheduler.length_threshold": t} for t in (0, 32, 64, 1024, 1537)]
