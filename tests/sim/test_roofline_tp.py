"""The roofline's tensor-parallel communication term, checked by hand: two ring all-reduces per
layer of the step's new tokens' activations, added to max(compute, memory); nothing at TP1."""

import dataclasses

import pytest

from pdjax.models.llama_config import LlamaConfig
from pdjax.sim.hardware import HARDWARE, Hardware
from pdjax.sim.roofline import RooflineCost

# A round-number model and chip: hidden 100, 2 layers, bf16 (2 bytes); the chip-to-chip link
# moves 1e8 bytes/s per direction with 1 us per ring step.
CFG = LlamaConfig(vocab_size=1000, hidden_size=100, intermediate_size=200, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=25)
CHIP = Hardware("test", bf16_flops=1e12, hbm_bytes=1e9, hbm_bytes_per_s=1e9,
                link_bytes_per_s=5e7, ici_bytes_per_s=1e8, ici_latency_s=1e-6)
PREFILL = [(30, 0), (10, 5)]     # 40 new tokens
DECODE = [10, 30, 50, 70]        # a batch of 4


def _llama8b():
  """Llama-3-8B shapes (hidden 4096, 32 layers, GQA 32/8 heads of 128)."""
  return LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                     num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128)


def _cost(tp, cfg=CFG, **kw):
  return RooflineCost(cfg, CHIP, tp, dtype_bytes=2, eff_flops=1.0, eff_bw=1.0,
                      step_overhead_s=0.0, **kw)


def _prefill_roofline(tp, eff_flops=1.0, eff_bw=1.0):
  """max(compute, memory) of PREFILL, written out (280_000 matmul params, 760_000 weight
  bytes, 400 KV bytes per token; see test_sim.test_roofline_by_hand)."""
  attn = 4 * 2 * 4 * 25 * (30 * (0 + 31 / 2) + 10 * (5 + 11 / 2))
  flops = 2 * 280_000 * 40 + attn
  bytes_ = 760_000 + 400 * (30 + 15)
  return max(flops / (1e12 * tp * eff_flops), bytes_ / (1e9 * tp * eff_bw))


def _decode_roofline(tp, eff_flops=1.0, eff_bw=1.0):
  flops = 2 * 280_000 * 4 + 4 * 2 * 4 * 25 * 160
  bytes_ = 760_000 + 400 * 160
  return max(flops / (1e12 * tp * eff_flops), bytes_ / (1e9 * tp * eff_bw))


def test_tp1_step_times_are_the_plain_roofline():
  # The default knobs (50% of peak FLOPs, 70% of bandwidth, 0.2 ms per step): the old formula,
  # max(compute, memory) + overhead, to the last bit.
  cost = RooflineCost(CFG, CHIP, 1)
  assert cost.prefill_s(PREFILL) == _prefill_roofline(1, 0.5, 0.7) + 0.0002
  assert cost.decode_s(DECODE) == _decode_roofline(1, 0.5, 0.7) + 0.0002
  assert cost.comm_s(40) == cost.comm_s(4) == cost.comm_s(100_000) == 0.0
  # Llama-3-8B-like shapes on h100: still no communication at TP1.
  assert RooflineCost(_llama8b(), HARDWARE["h100"], 1).comm_s(4096) == 0.0


def test_tp2_and_tp4_all_reduce_terms_by_hand():
  # Decode, batch 4: each all-reduce is 4 tokens x 100 hidden x 2 bytes = 800 bytes.
  #   TP2: each chip sends 2 * 1/2 * 800 = 800 bytes -> 8 us; 2 steps x 1 us -> 10 us.
  #   TP4: 2 * 3/4 * 800 = 1200 bytes -> 12 us; 6 steps x 1 us -> 18 us.
  # Two all-reduces per layer, 2 layers: x 4 -> 40 us (TP2), 72 us (TP4).
  assert _cost(2).allreduce_s(800) == pytest.approx(10e-6, rel=1e-12)
  assert _cost(4).allreduce_s(800) == pytest.approx(18e-6, rel=1e-12)
  assert _cost(2).comm_s(4) == pytest.approx(40e-6, rel=1e-12)
  assert _cost(4).comm_s(4) == pytest.approx(72e-6, rel=1e-12)
  assert _cost(2).decode_s(DECODE) == pytest.approx(_decode_roofline(2) + 40e-6, rel=1e-12)
  assert _cost(4).decode_s(DECODE) == pytest.approx(_decode_roofline(4) + 72e-6, rel=1e-12)
  # Prefill of 30 + 10 = 40 new tokens (the 5 cached ones move nothing): 8000 bytes each.
  #   TP2: 8000 bytes -> 80 us + 2 us = 82 us; x 4 -> 328 us.
  #   TP4: 12000 bytes -> 120 us + 6 us = 126 us; x 4 -> 504 us.
  assert _cost(2).comm_s(40) == pytest.approx(328e-6, rel=1e-12)
  assert _cost(4).comm_s(40) == pytest.approx(504e-6, rel=1e-12)
  assert _cost(2).prefill_s(PREFILL) == pytest.approx(_prefill_roofline(2) + 328e-6, rel=1e-12)
  assert _cost(4).prefill_s(PREFILL) == pytest.approx(_prefill_roofline(4) + 504e-6, rel=1e-12)
  # The overhead is still added once, after the communication.
  with_overhead = RooflineCost(CFG, CHIP, 2, eff_flops=1.0, eff_bw=1.0, step_overhead_s=1e-3)
  assert with_overhead.decode_s(DECODE) == pytest.approx(_decode_roofline(2) + 40e-6 + 1e-3,
                                                         rel=1e-12)


def test_the_collective_link_can_be_overridden_and_defaults_to_the_p2d_link():
  # RooflineCost's own knobs win over the hardware's: 2e8 bytes/s, no latency -> TP2 decode
  # all-reduce of 800 bytes = 4 us; x 4 -> 16 us.
  assert _cost(2, ici_bytes_per_s=2e8, ici_latency_s=0.0).comm_s(4) == pytest.approx(
      16e-6, rel=1e-12)
  # A chip without an interconnect figure runs its collectives at its P->D link, with the
  # default 2 us per step: 800 bytes / 5e7 = 16 us + 2 steps x 2 us = 20 us; x 4 -> 80 us.
  bare = Hardware("bare", 1e12, 1e9, 1e9, link_bytes_per_s=5e7)
  assert bare.collective_bytes_per_s == 5e7 and bare.ici_latency_s == 2e-6
  assert RooflineCost(CFG, bare, 2).comm_s(4) == pytest.approx(80e-6, rel=1e-12)
  # The P->D transfer link override does not touch the collectives.
  assert _cost(2, link_bytes_per_s=1e12).comm_s(4) == pytest.approx(40e-6, rel=1e-12)


def test_communication_is_affine_in_tokens_linear_in_layers_and_zero_at_tp1():
  for tp in (2, 4, 8):
    cost = _cost(tp)
    per_token = cost.comm_s(2) - cost.comm_s(1)
    assert per_token > 0
    for t in (1, 7, 64, 1000):
      assert cost.comm_s(t + 1) - cost.comm_s(t) == pytest.approx(per_token, rel=1e-9)
    # The latency part is fixed per step: comm(t) = t * per_token + 2 * L * 2 (TP - 1) * lat.
    fixed = 2 * 2 * 2 * (tp - 1) * 1e-6
    assert cost.comm_s(50) == pytest.approx(50 * per_token + fixed, rel=1e-12)
    # Twice the layers: twice the communication, token for token.
    deeper = _cost(tp, cfg=dataclasses.replace(CFG, num_layers=4))
    for t in (1, 40, 512):
      assert deeper.comm_s(t) == pytest.approx(2 * cost.comm_s(t), rel=1e-12)
    assert cost.comm_s(0) == 0.0
  assert all(_cost(1).comm_s(t) == 0.0 for t in (1, 40, 512, 10_000))
  assert _cost(1, cfg=dataclasses.replace(CFG, num_layers=4)).comm_s(512) == 0.0


def test_tp8_on_h100_costs_more_communication_per_token_than_tp2():
  h100 = HARDWARE["h100"]
  assert h100.collective_bytes_per_s == 450e9 and h100.ici_latency_s == 2e-6
  tp2, tp8 = (RooflineCost(_llama8b(), h100, tp) for tp in (2, 8))
  # Decode, batch 64: each all-reduce is 64 x 4096 x 2 = 524_288 bytes; 64 all-reduces a step.
  #   TP2: 524_288 / 450e9 = 1.165 us + 2 x 2 us           -> 5.165 us; x 64 = 330.565 us
  #   TP8: 14/8 x 524_288 / 450e9 = 2.039 us + 14 x 2 us  -> 30.04 us; x 64 = 1922.49 us
  assert tp2.comm_s(64) == pytest.approx(64 * (524_288 / 450e9 + 4e-6), rel=1e-12)
  assert tp8.comm_s(64) == pytest.approx(64 * (14 / 8 * 524_288 / 450e9 + 28e-6), rel=1e-12)
  assert tp2.comm_s(64) == pytest.approx(330.565e-6, rel=1e-5)
  assert tp8.comm_s(64) == pytest.approx(1922.49e-6, rel=1e-5)
  for tokens in (1, 64, 256, 2048, 8192):
    assert tp8.comm_s(tokens) / tokens > tp2.comm_s(tokens) / tokens > 0
  # The term shows in the step time: a TP8 decode step is its roofline plus ~1.9 ms.
  contexts = [1000] * 64
  free_links = RooflineCost(_llama8b(), h100, 8, ici_bytes_per_s=float("inf"), ici_latency_s=0.0)
  assert free_links.comm_s(64) == 0.0
  assert tp8.decode_s(contexts) == pytest.approx(free_links.decode_s(contexts) + tp8.comm_s(64),
                                                 rel=1e-12)
