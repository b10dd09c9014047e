"""Tests for pdjax.workload.loader: defaults, every kind, validation messages."""

import os

import ml_collections
import pytest

from helpers.paths import FIXTURES
from pdjax.workload import loader
from pdjax.workload.synthetic import synthetic_requests

VOCAB, EOS = 128, (2,)


def config(**overrides):
  w = loader.default_workload_config()
  w.update(overrides)
  return w


def load(w, **kw):
  return loader.load_workload(w, **{"seed": 0, "vocab_size": VOCAB, "eos_ids": EOS,
                                    "max_model_len": 512, **kw})


def test_defaults():
  w = loader.default_workload_config()
  assert isinstance(w, ml_collections.ConfigDict)
  assert w.to_dict() == dict(
      kind="synthetic", path="", preset="mixed", arrival="poisson", rate=8.0, num_requests=64,
      time_scale=1.0, burstiness=1.0, on_s=2.0, off_s=2.0, ramp_to_rate=16.0,
      ignore_eos=False, tenants=1, chat_fraction=0.75, chat_prompt_len=(16, 64),
      chat_max_new_tokens=(16, 48), doc_prompt_len=(192, 448), doc_max_new_tokens=(8, 24),
      lognormal_prompt_mean=128.0, lognormal_output_mean=64.0, lognormal_sigma=1.0,
      lognormal_max_prompt_len=384, lognormal_max_output_len=128)
  assert loader.validate_workload(w) is None


def test_synthetic_default_matches_synthetic_requests():
  w = loader.default_workload_config()
  requests, problems = load(w, temperature=0.3)
  assert problems == []
  same = synthetic_requests(
      num_requests=64, rate=8.0, seed=0, vocab_size=VOCAB, chat_fraction=0.75,
      chat_prompt_len=(16, 64), chat_max_new_tokens=(16, 48), doc_prompt_len=(192, 448),
      doc_max_new_tokens=(8, 24), temperature=0.3, eos_ids=EOS)
  assert [(r.id, r.arrival_s, r.prompt_ids, r.sampling) for r in requests] == [
      (r.id, r.arrival_s, r.prompt_ids, r.sampling) for r in same]


def test_missing_keys_take_defaults():
  old_style = ml_collections.ConfigDict(dict(
      kind="synthetic", num_requests=5, rate=8.0, chat_fraction=0.75, chat_prompt_len=(16, 64),
      chat_max_new_tokens=(16, 48), doc_prompt_len=(192, 448), doc_max_new_tokens=(8, 24),
      ignore_eos=False))
  assert loader.validate_workload(old_style) is None
  requests, _ = load(old_style)
  assert len(requests) == 5


@pytest.mark.parametrize("preset", ["mixed", "chat", "long_doc_qa", "rag", "agent_multiturn",
                                    "lognormal"])
@pytest.mark.parametrize("arrival", ["poisson", "gamma", "onoff", "ramp"])
def test_synthetic_presets_and_arrivals(preset, arrival):
  w = config(preset=preset, arrival=arrival, num_requests=40, ignore_eos=True)
  requests, problems = load(w)
  assert problems == [] and len(requests) == 40
  assert [r.id for r in requests] == [f"req-{i:05d}" for i in range(40)]
  times = [r.arrival_s for r in requests]
  assert times[0] > 0 and all(b > a for a, b in zip(times, times[1:]))
  assert all(r.max_len <= 512 and r.sampling.ignore_eos and r.eos_ids == EOS
             for r in requests)
  if preset == "agent_multiturn":
    assert all(r.session for r in requests)


def test_synthetic_time_scale_and_truncation():
  base, _ = load(config(num_requests=20))
  fast, _ = load(config(num_requests=20, time_scale=0.5))
  assert [r.arrival_s for r in fast] == pytest.approx([r.arrival_s / 2 for r in base])
  requests, problems = load(config(num_requests=20, preset="long_doc_qa"), max_model_len=128)
  assert all(r.max_len <= 128 for r in requests)
  assert problems == [
      "synthetic:long_doc_qa: truncated 20 of 20 requests to fit max_model_len=128 "
      "(max_new_tokens <= 127, prompt keeps its first max_model_len - max_new_tokens tokens)"]


@pytest.mark.parametrize("kind, name, count, first_problem", [
    ("azure", "azure_small.csv", 5, "azure_small.csv:5: ContextTokens='abc' is not an integer"),
    ("burstgpt", "burstgpt_small.csv", 3,
     "burstgpt_small.csv:6: Request tokens='x' is not an integer"),
    ("mooncake", "mooncake_small.jsonl", 5,
     "mooncake_small.jsonl:5: bad JSON (Expecting ',' delimiter at column 59)"),
    ("jsonl", "trace_small.jsonl", 4,
     "trace_small.jsonl:4: missing key 'prompt_ids' or 'prompt_len'"),
])
def test_trace_kinds(kind, name, count, first_problem):
  path = os.path.join(FIXTURES, name)
  requests, problems = load(config(kind=kind, path=path, num_requests=0))
  assert len(requests) == count and problems[0] == first_problem
  times = [r.arrival_s for r in requests]
  assert times == sorted(times) and all(r.max_len <= 512 for r in requests)
  capped, _ = load(config(kind=kind, path=path, num_requests=2))
  assert len(capped) == 2
  fast, _ = load(config(kind=kind, path=path, num_requests=0, time_scale=0.5))
  assert [r.arrival_s for r in fast] == pytest.approx(
      [times[0] + (t - times[0]) / 2 for t in times])


def test_trace_truncation_reported_with_file_name():
  w = config(kind="azure", path=os.path.join(FIXTURES, "azure_small.csv"), num_requests=0)
  _, problems = load(w)
  assert problems[-1].startswith("azure_small.csv: truncated 2 of 5 requests")


@pytest.mark.parametrize("overrides, message", [
    (dict(kind="foo"),
     "workload.kind='foo' is not one of ['synthetic', 'azure', 'mooncake', 'burstgpt', "
     "'jsonl', 'python']"),
    (dict(kind="azure"), "workload.path='' is required for kind=azure"),
    (dict(preset="lognormal", lognormal_sigma=0.0),
     "workload.lognormal_sigma=0.0 must be a finite number > 0"),
    (dict(preset="lognormal", lognormal_max_prompt_len=0),
     "workload.lognormal_max_prompt_len=0 must be an integer >= 1"),
    (dict(kind="jsonl", path="/x"), "workload.path='/x' does not exist"),
    (dict(kind="jsonl", path="/"), "workload.path='/' is not a file"),
    (dict(preset="poem"),
     "workload.preset='poem' is not one of ['mixed', 'chat', 'long_doc_qa', 'rag', "
     "'agent_multiturn', 'lognormal']"),
    (dict(arrival="weibull"),
     "workload.arrival='weibull' is not one of ['poisson', 'gamma', 'onoff', 'ramp']"),
    (dict(rate=0.0), "workload.rate=0.0 must be >= 0.0001 requests per second (arrivals "
                     "further apart lose the clock's precision: at 1e-300 every duration "
                     "rounded away)"),
    (dict(rate=1e-300), "workload.rate=1e-300 must be >= 0.0001 requests per second (arrivals "
                        "further apart lose the clock's precision: at 1e-300 every duration "
                        "rounded away)"),
    (dict(num_requests=-1), "workload.num_requests=-1 must be >= 0"),
    (dict(time_scale=0.0), "workload.time_scale=0.0 must be > 0 and at most 1e+06 (times "
                           "stretched further lose the clock's precision)"),
    (dict(arrival="gamma", burstiness=0.0), "workload.burstiness=0.0 must be > 0"),
    (dict(arrival="onoff", on_s=0.0), "workload.on_s=0.0 must be > 0 seconds"),
    (dict(arrival="onoff", off_s=-1.0), "workload.off_s=-1.0 must be >= 0 seconds"),
    (dict(arrival="ramp", ramp_to_rate=-1.0),
     "workload.ramp_to_rate=-1.0 must be >= 0.0001 requests per second"),
    (dict(chat_fraction=1.5), "workload.chat_fraction=1.5 must be within [0, 1]"),
    (dict(doc_prompt_len=(9, 3)),
     "workload.doc_prompt_len=(9, 3) must be (low, high) with 1 <= low <= high"),
])
def test_validate_messages(overrides, message):
  w = config(**overrides)
  assert loader.validate_workload(w) == message
  with pytest.raises(ValueError) as e:
    load(w)
  assert str(e.value) == message


def test_unused_parameters_are_not_checked():
  assert loader.validate_workload(config(burstiness=0.0, on_s=0.0, preset="chat",
                                         chat_fraction=5.0)) is None


def test_max_model_len_must_leave_room():
  with pytest.raises(ValueError, match="max_model_len must be >= 2"):
    load(config(), max_model_len=1)


def test_tenants_follow_sessions():
  requests, _ = load(config(preset="agent_multiturn", num_requests=30, tenants=3))
  by_session = {}
  for r in requests:
    by_session.setdefault(r.session, set()).add(r.tenant)
  assert all(len(t) == 1 for t in by_session.values())     # a session stays with one tenant
  assert {r.tenant for r in requests} == {"tenant-0", "tenant-1", "tenant-2"}
  plain, _ = load(config(num_requests=5, tenants=2))
  assert [r.tenant for r in plain] == ["tenant-0", "tenant-1", "tenant-0", "tenant-1",
                                       "tenant-0"]


def test_tenants_must_be_a_positive_integer():
  assert loader.validate_workload(config(tenants=0)) == (
      "workload.tenants=0 must be an integer >= 1")


def test_jsonl_ids_reach_the_requests(tmp_path):
  path = tmp_path / "joined.jsonl"
  path.write_text(
      '{"id": "q-2", "arrival_s": 0.5, "prompt_ids": [5, 6], "output_len": 2}\n'
      '{"id": "q-1", "arrival_s": 0.0, "prompt_len": 3, "output_len": 2}\n'
      '{"id": "q-2", "arrival_s": 1.0, "prompt_len": 3, "output_len": 2}\n'
      '{"arrival_s": 2.0, "prompt_len": 3, "output_len": 2}\n')
  requests, problems = load(config(kind="jsonl", path=str(path), num_requests=0))
  assert [r.id for r in requests] == ["q-1", "q-2", "req-00002"]
  assert requests[1].prompt_ids == [5, 6]
  assert problems == ["joined.jsonl:3: id='q-2' duplicates line 1"]
