"""What a Driver is told about its run: budgets, the KV layout, failure handling, overlap and
streaming switches (DriverOptions). Pure Python."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class DriverOptions:
  token_budget: int          # prompt tokens per prefill step (prefill_first's limit)
  max_prefill_seqs: int      # sequences per prefill step
  max_decode_batch: int      # running sequences per instance
  max_model_len: int         # prompt + generated tokens per sequence
  pool_pages: int            # pages in each instance's pool
  page_size: int
  shared_salt: str = ""      # prefix cache: one salt for all tenants ("" = per tenant)
  tenant_quota_pages: int = 0   # KV pages a tenant may hold or reserve per tier (0: no quota)
  flush_schedule: tuple[tuple[float, str], ...] = ()   # (seconds, tenant): forget its cache
  vocab_size: int = 0        # prompt token ids must be in [0, vocab_size) (0: unchecked)
  transfer_failure_policy: str = "retry_then_recompute"   # or "fail"
  transfer_retries: int = 3  # retries of a failed KV transfer before the policy decides
  transfer_backoff_s: float = 0.005   # first retry's delay; doubles per retry
  transfer_timeout_s: float = 0.0     # an attempt stalled longer fails (0: no timeout)
  lease_s: float = 0.0       # prefill-side KV no decode instance pulled is reclaimed (0: never)
  debug: bool = False        # check every invariant after every loop turn
  step_timeout_s: float = 300.0   # a device step not done after this long (wall clock) means
                                  # a hung device: the instance is treated as dead (0: never)
  overlap: bool = True       # dispatch a worker's next step before its decode step's tokens
                             # reach the host (instances with `device_tokens`; see steps.py)
  fast_forward: bool = True  # virtual clock: run decode chains between events without a loop
                             # turn per step (identical results; see fast_forward.py)
  stream_layers: int = 0     # kv.stream_layers: a prompt's KV streamed to its decode instance
                             # while it prefills (instances with `streams_kv`; streams.py)
  stream_min_tokens: int = 0   # shorter prompts are sent whole after their prefill
  slo_ttft_s: float = 0.0    # the run's SLO, as the policies read it (RequestView.slo; 0: none)
  slo_tpot_s: float = 0.0
