"""Overlapped scheduling: the next step is dispatched before a decode step's tokens reach the
host, its input tokens taken from that step's output on the device.

Scheduler tests use the fake engine with device tokens (a pending token resolves to the fake's
token at that position); the engine tests run the tiny model and compare against the no-cache
reference and against overlap off."""

import dataclasses

import pytest

from helpers import fake_engine as fe
from conftest import tiny_engine_options
from pdjax.runner import serve_requests as serving
from pdjax.engine import programs
from pdjax.engine.cluster import build_instances
from pdjax.request import PendingToken, Request, SamplingParams, Status
from pdjax.scheduler.clock import ManualClock
from pdjax.scheduler.driver import Driver


class DeviceTokenFake(fe.FakeInstance):
  """The fake engine, taking PendingToken inputs: records each step's rows as
  (position, token or ("pending", row)), and checks a pending row names a row of `prev`."""

  device_tokens = True

  def prefill(self, seqs, prev=None):
    self._check(prev, [s[0][0] for s in seqs if len(s[0]) == 1], [s[1] for s in seqs])
    return super().prefill(seqs)

  def decode(self, seqs, prev=None):
    self._check(prev, [s[0] for s in seqs], [s[1] for s in seqs])
    return super().decode(seqs)

  def _check(self, prev, tokens, positions):
    pending = [t for t in tokens if isinstance(t, PendingToken)]
    assert (prev is not None) == bool(pending), (prev, tokens)
    for t in pending:
      assert t.row < len(prev.tokens)
    self.rows = getattr(self, "rows", []) + [[
        (p, ("pending", t.row) if isinstance(t, PendingToken) else t)
        for t, p in zip(tokens, positions[-len(tokens):] if tokens else [])]]


def _serve(reqs, overlap, eos_after=None):
  clock = ManualClock()
  inst = DeviceTokenFake("colocated-0", clock)
  driver = Driver("colocated", [fe.InstanceQueue(inst, "colocated")],
                  options=dataclasses.replace(fe.OPTS, overlap=overlap, debug=True), clock=clock)
  return driver.run(reqs), inst


def _reqs(eos=()):
  return [fe._req(0, 5, 6, eos=eos), fe._req(1, 3, 4, eos=eos), fe._req(2, 6, 5, arrival=0.3, eos=eos)]


def test_overlap_gives_the_same_tokens_and_dispatches_decodes_ahead():
  plain, _ = _serve(_reqs(), overlap=False)
  over, inst = _serve(_reqs(), overlap=True)
  assert [r.output_ids for r in over.requests] == [r.output_ids for r in plain.requests]
  assert [r.output_ids for r in over.requests] == [[105, 106, 107, 108, 109, 110],
                                                   [103, 104, 105, 106],
                                                   [106, 107, 108, 109, 110]]
  assert not any(s["ahead"] for s in plain.steps)
  ahead = [s for s in over.steps if s["ahead"]]
  assert len(ahead) >= 3 and {s["kind"] for s in ahead} == {"decode"}
  # Rows dispatched ahead take their token from the step in flight, one position on.
  pending = [(p, tok) for rows in inst.rows for p, tok in rows if isinstance(tok, tuple)]
  assert (6, ("pending", 0)) in pending and (4, ("pending", 1)) in pending
  assert inst.tables.num_free_pages == inst.tables.allocator.num_pages


def test_a_stop_on_the_overlapped_step_emits_nothing_past_it():
  # r0's 3rd token (107, at position 7) is a stop: the step after it was already dispatched
  # with r0's row (position 8, the pending token as input), and its token is dropped.
  over, inst = _serve(_reqs(eos=(107,)), overlap=True)
  r0 = over.requests[0]
  assert r0.output_ids == [105, 106, 107] and r0.finish_reason == "stop"
  assert [r.output_ids for r in over.requests[1:]] == [[103, 104, 105, 106],
                                                       [106, 107]]
  pending = [(p, tok) for rows in inst.rows for p, tok in rows if isinstance(tok, tuple)]
  assert (7, ("pending", 0)) in pending, inst.rows   # the row after the stop went out
  assert all(r.status is Status.FINISHED for r in over.requests)
  assert inst.tables.num_free_pages == inst.tables.allocator.num_pages


PROMPTS = [[(5 * i + 3 * j) % 400 + 3 for j in range(n)] for i, n in enumerate([3, 9, 17, 30])]
MAX_NEW = [10, 7, 12, 9]


def _engine_run(instances, stop: int, overlap: bool):
  reqs = [Request(id=f"r{i}", arrival_s=0.0, prompt_ids=p,
                  sampling=SamplingParams(max_new_tokens=m), eos_ids=(stop,))
          for i, (p, m) in enumerate(zip(PROMPTS, MAX_NEW))]
  return serving.serve("colocated", instances, reqs, overlap=overlap, debug=True)


def test_engine_overlap_matches_the_reference_and_stops_exactly(tiny_model):
  """A stop token sampled by a step that the next one overlapped: the real engine drops the
  row after it, and every output equals the no-cache reference's, overlap on or off."""
  cfg, params = tiny_model
  free = programs.reference_generate(params, cfg, PROMPTS[0], MAX_NEW[0])
  at = next(i for i in range(3, len(free)) if free[i] not in free[:i])
  stop = free[at]           # r0 stops at a decode step's output, its first occurrence
  want = [programs.reference_generate(params, cfg, p, m, eos_ids=(stop,))
          for p, m in zip(PROMPTS, MAX_NEW)]
  assert want[0] == free[:at + 1]
  instances = build_instances([("colocated", 1, 1)], cfg, params, tiny_engine_options())
  for overlap in (True, False):
    result = _engine_run(instances, stop, overlap)
    assert [r.output_ids for r in result.requests] == want
    assert result.requests[0].finish_reason == "stop"
    ahead = [s for s in result.steps if s["ahead"]]
    assert (len(ahead) > 0) == overlap
    assert serving.kv_pages_leaked(instances) == 0


def test_auto_overlap_is_off_on_the_cpu_backend_and_on_elsewhere(tiny_model):
  cfg, params = tiny_model
  cpu = build_instances([("colocated", 1, 1)], cfg, params, tiny_engine_options())
  assert cpu[0].overlap_by_default is False
  assert serving.resolve_overlap("auto", cpu) is False
  assert serving.resolve_overlap("on", cpu) is True
  accelerator = [dataclasses.make_dataclass("A", [("overlap_by_default", bool)])(True)]
  assert serving.resolve_overlap("auto", accelerator) is True
  with pytest.raises(ValueError, match="^overlap must be true, false or 'auto', got 'yes'$"):
    serving.resolve_overlap("yes", cpu)
