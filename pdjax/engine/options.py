"""EngineOptions: an instance's page geometry, step buckets and numerics, and how a config maps
to them. Pure Python (no jax): the simulator and the calibration share it with the engine."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class EngineOptions:
  page_size: int
  num_pages: int
  max_model_len: int
  prefill_buckets: tuple[int, ...]     # packed prompt tokens per prefill step
  max_prefill_seqs: int
  decode_buckets: tuple[int, ...]      # sequences per decode step
  dtype: str = "float32"
  seed: int = 0
  attention_impl: str = "auto"         # "auto" | "pallas" | "xla" (model.attention_impl)
  param_layout: str = "auto"           # "auto" | "stacked" | "unrolled" (model.param_layout)
  lazy_compile: bool = False           # compile a step bucket on its first use instead of in
                                       # warm-up (offline runs: unused buckets cost nothing)
  stream_layers: int = 0               # kv.stream_layers: layer groups a streamed prefill runs
                                       # as (0: off; engine/layer_groups.py)

  @property
  def pages_per_seq(self) -> int:
    return -(-self.max_model_len // self.page_size)

  @property
  def token_rows(self) -> int:
    """Tokens every step program returns (the largest batch either step takes), so any step's
    output can feed any next step's input."""
    return max(max(self.decode_buckets), self.max_prefill_seqs)

  @property
  def transfer_buckets(self) -> tuple[int, ...]:
    """Powers of two up to pages_per_seq: the piece sizes a transfer is cut into (37 pages
    move as 32 + 4 + 1), so it moves exactly the pages it needs from programs compiled ahead."""
    out, n = [], 1
    while n < self.pages_per_seq:
      out.append(n)
      n *= 2
    return tuple(out) + (self.pages_per_seq,)


def tier_options(cfg, opts: EngineOptions) -> dict[str, EngineOptions]:
  """Per role, the run's options with that tier's KV pool (cluster.<role>.kv_pages, when set)."""
  return {role: dataclasses.replace(opts, num_pages=cfg.cluster[role].get("kv_pages", 0)
                                    or opts.num_pages)
          for role in ("prefill", "decode", "colocated")}


def engine_options(cfg, chunked: bool = False) -> EngineOptions:
  """Chunked prefill packs every running decode plus a chunk into one ragged step, so its
  ragged program holds up to max_decode_batch + 1 sequences."""
  max_seqs = cfg.scheduler.max_prefill_seqs
  if chunked:
    max_seqs = max(max_seqs, max(cfg.scheduler.decode_buckets) + 1)
  return EngineOptions(page_size=cfg.kv.page_size, num_pages=cfg.kv.pages_per_instance,
                       max_model_len=cfg.kv.max_model_len,
                       prefill_buckets=tuple(cfg.scheduler.prefill_buckets),
                       max_prefill_seqs=max_seqs,
                       decode_buckets=tuple(cfg.scheduler.decode_buckets),
                       dtype=cfg.model.dtype, seed=cfg.seed,
                       attention_impl=cfg.model.attention_impl,
                       param_layout=cfg.model.get("param_layout", "auto"),
                       stream_layers=cfg.kv.get("stream_layers", 0))
