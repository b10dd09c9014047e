"""Layer-group KV streaming in the simulator and the driver (kv.stream_layers): the exposed
transfer by hand, tokens identical to sending after prefill, the minimum-length gate, and
nothing leaked when a streamed request ends early or its decode instance dies mid-stream."""

import dataclasses

import pytest

from pdjax.engine.options import EngineOptions
from pdjax.models.llama_config import LlamaConfig
from pdjax.request import Request, SamplingParams, Status
from pdjax.runner import serve_requests as serving
from pdjax.scheduler.clock import ManualClock
from pdjax.sim.hardware import Hardware
from pdjax.sim.instance import SimInstance, sim_transfer
from pdjax.sim.roofline import RooflineCost

# Round numbers: 4 layers, 800 bytes of KV per token (k+v x 4 layers x 2 kv heads x 25 x 2
# bytes), a 1e9 B/s link (1e6 for a slow one), no latency.
CFG = LlamaConfig(vocab_size=1000, hidden_size=100, intermediate_size=200, num_layers=4,
                  num_heads=4, num_kv_heads=2, head_dim=25)
CHIP = Hardware("test", bf16_flops=1e12, hbm_bytes=1e9, hbm_bytes_per_s=1e9,
                link_bytes_per_s=1e9)


def _opts(stream_layers):
  return EngineOptions(page_size=16, num_pages=256, max_model_len=512, prefill_buckets=(512,),
                       max_prefill_seqs=4, decode_buckets=(16,), stream_layers=stream_layers)


def _instances(stream_layers, clock, decode=1, link=1e9):
  cost = RooflineCost(CFG, dataclasses.replace(CHIP, link_bytes_per_s=link), tp=1, dtype_bytes=2, eff_flops=1.0, eff_bw=1.0,
                      step_overhead_s=0.0, link_latency_s=0.0)
  make = lambda name, role: SimInstance(name, role, cost, _opts(stream_layers), clock=clock,
                                        vocab_size=1000, eos_ids=(2,), num_layers=4)
  return [make("prefill-0", "prefill")] + [make(f"decode-{i}", "decode") for i in range(decode)]


def _serve(stream_layers, prompts, min_tokens=0, max_new=(5,), decode=1, injector=None,
           link=1e9, eos=None):
  clock = ManualClock()
  insts = _instances(stream_layers, clock, decode, link)
  reqs = [Request(id=f"r{i}", arrival_s=0.01 * i, prompt_ids=[5 + i] * n,
                  sampling=SamplingParams(max_new_tokens=max_new[i % len(max_new)]),
                  eos_ids=(2,) if eos is None else eos[i]) for i, n in enumerate(prompts)]
  result = serving.serve("disaggregated", insts, reqs, clock=clock, transfer_fn=sim_transfer,
                         stream_layers=stream_layers, stream_min_tokens=min_tokens,
                         injector=injector)
  assert serving.kv_pages_leaked(insts) == 0
  assert all(r.status.terminal for r in result.requests)
  return result, insts


def test_the_exposed_transfer_by_hand():
  """One 320-token prompt (20 pages), 4 groups of one layer: the step takes s seconds, each
  group's quarter of the KV takes t = bytes / 4 / 1e8 on the link and leaves when its layer is
  computed; the link keeps up (t < s / 4), so only the last quarter is exposed: t."""
  (r,), insts = (lambda res: (res[0].requests, res[1]))(_serve(4, [320]))
  src = insts[0]
  step_s = src.cost.prefill_s([(320, 0)])
  total = src.kv_bytes(20)
  quarter = total / 4 / 1e9
  assert quarter < step_s / 4
  assert r.transfer_bytes == int(total)
  assert r.prefill_end_s - r.prefill_start_s == pytest.approx(step_s)
  assert r.transfer_exposed_s == pytest.approx(quarter)
  assert r.transfer_start_s == r.prefill_start_s   # sent from the step's dispatch on
  assert r.transfer_s == pytest.approx(step_s * 3 / 4 + quarter)   # first group out -> landed
  # group g lands a quarter's copy after the step has computed through its layer
  assert r.transfer_group_ends_s == pytest.approx([step_s * g / 4 + quarter for g in (1, 2, 3, 4)])
  unstreamed = _serve(0, [320])[0].requests[0]
  assert unstreamed.transfer_exposed_s == pytest.approx(total / 1e9)   # all of it
  assert unstreamed.decode_start_s - r.decode_start_s == pytest.approx(total / 1e9 - quarter)


def test_a_slow_link_leaves_the_groups_queued_behind_each_other():
  """A link 1,000x slower: each group's copy outlasts the compute, so they queue; the exposed
  part is the whole transfer less the first group's head start (s / 4)."""
  (r,), insts = (lambda res: (res[0].requests, res[1]))(_serve(4, [320], link=1e6))
  step_s = insts[0].cost.prefill_s([(320, 0)])
  total = insts[0].kv_bytes(20) / 1e6
  assert total / 4 > step_s / 4
  assert r.transfer_exposed_s == pytest.approx(step_s / 4 + total - step_s)


def test_tokens_equal_the_unstreamed_run_and_short_prompts_go_whole():
  prompts = [40, 300, 7, 130, 260, 33]
  base = _serve(0, prompts, max_new=(6, 3, 9))[0]
  for groups, gate in ((2, 0), (4, 100), (1, 0)):
    got = _serve(groups, prompts, min_tokens=gate, max_new=(6, 3, 9))[0]
    assert [r.output_ids for r in got.requests] == [r.output_ids for r in base.requests]
    streamed = [r.transfer_start_s == r.prefill_start_s for r in got.requests]
    assert streamed == [n >= gate for n in prompts], (groups, gate)
    assert all(r.status == Status.FINISHED for r in got.requests)


@pytest.fixture
def bound(monkeypatch):
  """The stream bindings the driver makes (requests bound to a decode instance at dispatch)."""
  from pdjax.scheduler.streams import Streams
  out = []
  original = Streams._stream_calls
  monkeypatch.setattr(Streams, "_stream_calls",
                      lambda self, w, b: out.extend(r for r, _, _ in b) or original(self, w, b))
  return out


def test_a_request_ending_at_its_first_token_releases_its_decode_pages(bound):
  """Each request's first token is its EOS: streamed (bound at dispatch), then released at
  collection, never transferred."""
  first = [r.output_ids[0] for r in _serve(2, [64, 64])[0].requests]
  bound.clear()
  result, insts = _serve(2, [64, 64], eos=[(t,) for t in first])
  assert [r.id for r in bound] == ["r0", "r1"]
  assert [r.output_ids for r in result.requests] == [[t] for t in first]
  assert [r.transfer_start_s for r in result.requests] == [None, None]
  assert result.transfers == []
  assert insts[1].tables.num_used_pages == 0   # (the bindings released; kv_pages_leaked too)


def test_a_request_asking_for_one_token_is_not_streamed(bound):
  """max_new_tokens=1 never decodes: no decode instance is bound for it."""
  result, insts = _serve(2, [64, 64], max_new=(1,))
  assert [len(r.output_ids) for r in result.requests] == [1, 1]
  assert bound == [] and insts[1].tables.num_used_pages == 0
  _serve(2, [64, 64], max_new=(2,))
  assert len(bound) == 2                       # (the same prompts asking for 2 are streamed)


def test_a_decode_instance_killed_mid_stream_sends_the_request_elsewhere():
  """decode-0 dies while the first prompt prefills (its KV streaming there): the request is
  sent whole to decode-1 after its prefill; nothing leaks, the tokens are the unstreamed
  run's."""
  from pdjax.faults.injector import FaultInjector
  from pdjax.faults.spec import FaultSpec
  prompts = [480, 480, 480]
  base = _serve(0, prompts, decode=2)[0]
  spec = FaultSpec(kills=(("decode-0", 1e-6),))
  got = _serve(2, prompts, decode=2, injector=FaultInjector(spec))[0]
  assert [r.output_ids for r in got.requests] == [r.output_ids for r in base.requests]
  assert got.requests[0].decode_instance == "decode-1"


def _fault_injector(**kw):
  from pdjax.faults.injector import FaultInjector
  from pdjax.faults.spec import FaultSpec
  return FaultInjector(FaultSpec(**kw))


def test_injected_stream_failures_are_retried_like_whole_transfers():
  """Half the transfer attempts fail (the same draws streamed or not): streamed failures are
  retried whole, tokens and the retry count equal the unstreamed run's."""
  prompts = [64, 200, 90, 300, 150, 75]
  base = _serve(0, prompts, injector=_fault_injector(transfer_fail_prob=0.5, seed=3))[0]
  got = _serve(2, prompts, injector=_fault_injector(transfer_fail_prob=0.5, seed=3))[0]
  assert [r.output_ids for r in got.requests] == [r.output_ids for r in base.requests]
  assert got.faults["transfer_retries"] == base.faults["transfer_retries"] > 0
  assert ([t["ok"] for t in got.transfers].count(False)
          == [t["ok"] for t in base.transfers].count(False))
  assert [r.fallbacks for r in got.requests] == [r.fallbacks for r in base.requests]


def test_a_streamed_transfer_failing_on_the_device_is_retried_then_falls_back(monkeypatch):
  """The first request's streamed transfer raises DeviceError when it lands: with retries it
  moves whole and its tokens are the unstreamed run's; with none it is recomputed on the
  decode instance (the fallback recorded); the second request's stream lands either way."""
  from pdjax.errors import DeviceError
  from pdjax.sim import stream_transfer
  real = stream_transfer.streamed_transfers

  def first_fails(src, step_s, streams, num_layers):
    out = real(src, step_s, streams, num_layers)
    if not getattr(first_fails, "done", False):
      first_fails.done = True

      def boom():
        raise DeviceError("group 2 of 2: link reset")
      out[0].result = boom
    return out
  monkeypatch.setattr("pdjax.sim.instance.streamed_transfers", first_fails)
  base = _serve(0, [64, 64])[0]
  got = _serve(2, [64, 64])[0]
  assert [r.output_ids for r in got.requests] == [r.output_ids for r in base.requests]
  assert got.faults["transfer_retries"] == 1 and [t["ok"] for t in got.transfers] == [
      False, True, True]
  first_fails.done = False
  clock = ManualClock()
  insts = _instances(2, clock)
  reqs = [Request(id=f"r{i}", arrival_s=0.01 * i, prompt_ids=[5 + i] * 64,
                  sampling=SamplingParams(max_new_tokens=5), eos_ids=(2,)) for i in range(2)]
  result = serving.serve("disaggregated", insts, reqs, clock=clock, transfer_fn=sim_transfer,
                         stream_layers=2, transfer_retries=0)
  assert result.requests[0].fallbacks and result.requests[0].status == Status.FINISHED
  assert [r.output_ids for r in result.requests] == [r.output_ids for r in base.requests]
  assert serving.kv_pages_leaked(insts) == 0


def test_requests_cancelled_while_their_kv_streams_free_both_sides():
  prompts = [64, 200, 90, 300]
  result, insts = _serve(2, prompts, injector=_fault_injector(cancel_prob=1.0,
                                                              cancel_stages=("prefill",)))
  assert [r.status for r in result.requests] == [Status.CANCELLED] * 4
  assert all(i.tables.num_used_pages == 0 for i in insts)   # (reservations: end-of-run check)


def test_the_trace_draws_a_streamed_transfer_overlapping_its_prefill():
  """A streamed request's transfer span starts inside its prefill span, on a track of its
  own (spans on one track must nest); an unstreamed one stays on the request's track."""
  from pdjax.metrics.trace import STREAM_TID, trace_events
  result, _ = _serve(2, [320, 40], min_tokens=100)
  events = list(trace_events(requests=result.requests, steps=result.steps,
                             role_switches=result.role_switches, samples=result.samples))
  spans = {(e["tid"], e["name"]): e for e in events if e.get("pid") == 2 and e["ph"] == "X"}
  names = {e["tid"]: e["args"]["name"] for e in events
           if e.get("pid") == 2 and e["ph"] == "M" and e["name"] == "thread_name"}
  prefill, stream = spans[(1, "prefill")], spans[(STREAM_TID + 1, "transfer")]
  assert names[STREAM_TID + 1] == "r0 KV stream"
  assert prefill["ts"] <= stream["ts"] < prefill["ts"] + prefill["dur"] < stream["ts"] + stream["dur"]
  assert (2, "transfer") in spans and STREAM_TID + 2 not in names   # r1: 40 tokens, not streamed
  # each group's span on the stream track, one after the other: group 0 lands inside the
  # prefill, group 1 (the last) after it, ending with the transfer
  g0, g1 = spans[(STREAM_TID + 1, "group 0")], spans[(STREAM_TID + 1, "group 1")]
  assert g0["ts"] == stream["ts"] and g0["ts"] + g0["dur"] == g1["ts"]
  assert g0["ts"] + g0["dur"] < prefill["ts"] + prefill["dur"] < g1["ts"] + g1["dur"]
  assert g1["ts"] + g1["dur"] == pytest.approx(stream["ts"] + stream["dur"], abs=1)
  assert (g0["args"]["of"], g1["args"]["of"]) == (2, 2) and (STREAM_TID + 1, "group 2") not in spans


def test_cancels_planned_for_the_transfer_apply_to_streamed_requests():
  """Clients that cancel while their KV moves: a streamed request is in transfer from its
  prefill's collection, so the cancel lands there too; everything freed on both sides."""
  prompts = [64, 200, 90, 300]
  result, insts = _serve(2, prompts, injector=_fault_injector(cancel_prob=1.0,
                                                              cancel_stages=("transfer",)))
  assert [r.status for r in result.requests] == [Status.CANCELLED] * 4
  assert [r.reason for r in result.requests] == ["cancelled by the client (transfer)"] * 4
  assert all(i.tables.num_used_pages == 0 for i in insts)
