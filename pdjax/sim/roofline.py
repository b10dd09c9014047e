"""Roofline step-time model for a Llama-family decoder on one instance (TP chips).

Per step, with P the parameter count (embeddings excluded from FLOPs), L layers, H query heads,
KVH kv heads, D head dim, b bytes per element, TP chips of peak F FLOP/s and bandwidth B:
  prefill/mixed step over chunks (q_i new tokens after c_i cached ones):
    flops  = 2 * P_matmul * sum(q_i) + 4 * L * H * D * sum(q_i * (c_i + (q_i + 1) / 2))
    bytes  = weight_bytes + kv bytes read (L * 2 * KVH * D * b * sum(c_i + q_i))
    time   = max(flops / (F * TP * eff_flops), bytes / (B * TP * eff_bw)) + overhead
  decode step over contexts n_j:
    flops  = 2 * P_matmul * batch + 4 * L * H * D * sum(n_j)
    bytes  = weight_bytes + L * 2 * KVH * D * b * sum(n_j)
    time   = max(flops / (F * TP * eff_flops), bytes / (B * TP * eff_bw)) + overhead
  transfer of KV bytes X over a link of bandwidth W:  X / W + link latency.
The efficiency factors and the fixed per-step overhead are the calibration knobs.
"""

from __future__ import annotations

import dataclasses
import functools

from pdjax.models.llama_config import LlamaConfig
from pdjax.sim.hardware import Hardware


@dataclasses.dataclass(frozen=True)
class RooflineCost:
  cfg: LlamaConfig
  hw: Hardware
  tp: int
  dtype_bytes: int = 2
  eff_flops: float = 0.5
  eff_bw: float = 0.7
  step_overhead_s: float = 0.0002
  link_bytes_per_s: float | None = None
  link_latency_s: float = 1e-5

  @functools.cached_property
  def matmul_params(self) -> int:
    c = self.cfg
    attn = c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads)
    mlp = 3 * c.hidden_size * c.intermediate_size
    return c.num_layers * (attn + mlp) + c.hidden_size * c.vocab_size

  @functools.cached_property
  def weight_bytes(self) -> float:
    return (self.matmul_params + self.cfg.hidden_size * self.cfg.vocab_size) * self.dtype_bytes

  def kv_bytes_per_token(self) -> float:
    c = self.cfg
    return 2 * c.num_layers * c.num_kv_heads * c.head_dim * self.dtype_bytes

  def _time(self, flops: float, bytes_: float) -> float:
    compute = flops / (self.hw.bf16_flops * self.tp * self.eff_flops)
    memory = bytes_ / (self.hw.hbm_bytes_per_s * self.tp * self.eff_bw)
    return max(compute, memory) + self.step_overhead_s

  def prefill_s(self, chunks: list[tuple[int, int]]) -> float:
    """chunks: (new tokens q, cached tokens before them c) per sequence."""
    c = self.cfg
    tokens = sum(q for q, _ in chunks)
    attn = 4 * c.num_layers * c.num_heads * c.head_dim * sum(q * (k + (q + 1) / 2)
                                                              for q, k in chunks)
    kv_read = self.kv_bytes_per_token() * sum(q + k for q, k in chunks)
    return self._time(2 * self.matmul_params * tokens + attn, self.weight_bytes + kv_read)

  def decode_s(self, contexts: list[int]) -> float:
    c = self.cfg
    attn = 4 * c.num_layers * c.num_heads * c.head_dim * sum(contexts)
    kv_read = self.kv_bytes_per_token() * sum(contexts)
    return self._time(2 * self.matmul_params * len(contexts) + attn, self.weight_bytes + kv_read)

  transfer_waits_for_destination = False   # an ideal engine overlaps the copy

  def moved_pages(self, num_pages: int) -> int:
    return num_pages                         # an ideal engine moves exactly the pages

  def transfer_s(self, num_bytes: float) -> float:
    link = self.link_bytes_per_s or self.hw.link_bytes_per_s
    return num_bytes / link + self.link_latency_s
