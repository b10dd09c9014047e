"""Roofline step-time model for a Llama-family decoder on one instance (TP chips).

Per step, with P the parameter count (embeddings excluded from FLOPs), L layers, H query heads,
KVH kv heads, D head dim, E hidden size, b bytes per element, TP chips of peak F FLOP/s and
bandwidth B, joined by a chip-to-chip interconnect of W bytes/s per chip per direction and
latency lat per ring step:
  prefill/mixed step over chunks (q_i new tokens after c_i cached ones), T = sum(q_i):
    flops  = 2 * P_matmul * T + 4 * L * H * D * sum(q_i * (c_i + (q_i + 1) / 2))
    bytes  = weight_bytes + kv bytes read (L * 2 * KVH * D * b * sum(c_i + q_i))
  decode step over contexts n_j, T = batch:
    flops  = 2 * P_matmul * T + 4 * L * H * D * sum(n_j)
    bytes  = weight_bytes + L * 2 * KVH * D * b * sum(n_j)
  both:
    comm   = 2 * L * allreduce(T * E * b)             (0 when TP == 1)
    allreduce(X) = 2 * (TP - 1) / TP * X / W + 2 * (TP - 1) * lat
    W: ICI per chip per direction; on an instance over hosts > 1 hosts the ring crosses the
    inter-host link, and a ring runs at its slowest hop: W = min(ICI, DCN) (hardware.py)
    time   = max(flops / (F * TP * eff_flops), bytes / (B * TP * eff_bw)) + comm + overhead
  transfer of KV bytes X over a link of bandwidth W':  X / W' + link latency.
The communication term is Megatron-style TP as pdjax shards (heads and MLP intermediate split
over TP, pdjax/engine/mesh.py): each layer all-reduces its activations twice, after attention's
o_proj and after the MLP's down_proj, each a ring all-reduce (every chip sends 2 (TP - 1) / TP
of the bytes in 2 (TP - 1) steps). It is added to, not overlapped with, the compute/memory
time: the conservative choice, and what serving engines without compute-collective overlap see.
The efficiency factors and the fixed per-step overhead are the calibration knobs.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

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
  ici_bytes_per_s: float | None = None   # TP all-reduce bandwidth; None: the hardware's
  ici_latency_s: float | None = None     # per ring step; None: the hardware's
  hosts: int = 1                          # hosts the TP chips span (> 1: the ring pays DCN)

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

  def allreduce_s(self, num_bytes: float) -> float:
    """One ring all-reduce of `num_bytes` (the full tensor) over the TP chips: each chip sends
    2 (TP - 1) / TP of the bytes over its interconnect in 2 (TP - 1) latency-bound steps. A ring
    over several hosts moves at its slowest hop's bandwidth: the inter-host link's."""
    if self.tp == 1 or num_bytes <= 0:
      return 0.0
    steps = 2 * (self.tp - 1)
    bw = self.ici_bytes_per_s or self.hw.collective_bytes_per_s
    if self.hosts > 1 and self.hw.dcn_bytes_per_s:
      bw = min(bw, self.hw.dcn_bytes_per_s)
    lat = self.hw.ici_latency_s if self.ici_latency_s is None else self.ici_latency_s
    return steps / self.tp * num_bytes / bw + steps * lat

  def comm_s(self, tokens: int) -> float:
    """A step's TP communication: two all-reduces per layer (after o_proj and after down_proj)
    of the step's new tokens' activations, tokens x hidden_size x dtype_bytes each."""
    c = self.cfg
    return 2 * c.num_layers * self.allreduce_s(tokens * c.hidden_size * self.dtype_bytes)

  def _time(self, flops: float, bytes_: float, tokens: int) -> float:
    compute = flops / (self.hw.bf16_flops * self.tp * self.eff_flops)
    memory = bytes_ / (self.hw.hbm_bytes_per_s * self.tp * self.eff_bw)
    return max(compute, memory) + self.comm_s(tokens) + self.step_overhead_s

  def prefill_s(self, chunks: list[tuple[int, int]]) -> float:
    """chunks: (new tokens q, cached tokens before them c) per sequence."""
    c = self.cfg
    tokens = sum(q for q, _ in chunks)
    attn = 4 * c.num_layers * c.num_heads * c.head_dim * sum(q * (k + (q + 1) / 2)
                                                              for q, k in chunks)
    kv_read = self.kv_bytes_per_token() * sum(q + k for q, k in chunks)
    return self._time(2 * self.matmul_params * tokens + attn, self.weight_bytes + kv_read,
                      tokens)

  def decode_s(self, contexts: list[int]) -> float:
    c = self.cfg
    attn = 4 * c.num_layers * c.num_heads * c.head_dim * sum(contexts)
    kv_read = self.kv_bytes_per_token() * sum(contexts)
    return self._time(2 * self.matmul_params * len(contexts) + attn, self.weight_bytes + kv_read,
                      len(contexts))

  def decode_s_steps(self, batch: int, context_sums: np.ndarray) -> np.ndarray:
    """decode_s of `batch` sequences whose contexts sum to each of context_sums (int64): the
    same floating-point operations in the same order, so each equals decode_s exactly (a
    decode chain's steps, pdjax/sim/decode_chain.py)."""
    c = self.cfg
    attn = 4 * c.num_layers * c.num_heads * c.head_dim * context_sums
    kv_read = self.kv_bytes_per_token() * context_sums
    flops = 2 * self.matmul_params * batch + attn
    compute = flops / (self.hw.bf16_flops * self.tp * self.eff_flops)
    memory = (self.weight_bytes + kv_read) / (self.hw.hbm_bytes_per_s * self.tp * self.eff_bw)
    return np.maximum(compute, memory) + self.comm_s(batch) + self.step_overhead_s

  def decode_s_floor(self) -> float:
    """No decode step is shorter (one sequence of one token: the time grows with both)."""
    return float(self.decode_s_steps(1, np.ones(1, np.int64))[0])

  transfer_waits_for_destination = False   # an ideal engine overlaps the copy

  def moved_pages(self, num_pages: int) -> int:
    return num_pages                         # an ideal engine moves exactly the pages

  def transfer_s(self, num_bytes: float) -> float:
    link = self.link_bytes_per_s or self.hw.link_bytes_per_s
    return num_bytes / link + self.link_latency_s
