"""Tests for pdjax.workload.traces and replay: fixtures with bad lines, caps, time scaling."""

import os

import pytest

from helpers.paths import FIXTURES
from pdjax.workload import traces
from pdjax.workload.replay import replay

AZURE = os.path.join(FIXTURES, "azure_small.csv")
BURSTGPT = os.path.join(FIXTURES, "burstgpt_small.csv")
MOONCAKE = os.path.join(FIXTURES, "mooncake_small.jsonl")
JSONL = os.path.join(FIXTURES, "trace_small.jsonl")
VOCAB, EOS = 128, (2,)


def play(rows, **kw):
  kw = {"source": "t", "seed": 0, "vocab_size": VOCAB, "eos_ids": EOS, "max_model_len": 512,
        **kw}
  return replay(rows, **kw)


def test_azure_rows_and_problems():
  rows, problems = traces.read_azure(AZURE)
  assert [r.line for r in rows] == [2, 3, 4, 9, 10]
  assert [r.arrival_s for r in rows] == pytest.approx([0.0, 0.5, 1.4, 4.0, 5.0], abs=1e-9)
  assert [(r.prompt_len, r.output_len) for r in rows][:2] == [(374, 44), (396, 109)]
  assert problems == [
      "azure_small.csv:5: ContextTokens='abc' is not an integer",
      "azure_small.csv:6: expected 3 columns (TIMESTAMP,ContextTokens,GeneratedTokens), got 2",
      "azure_small.csv:7: GeneratedTokens=0 must be >= 1",
      "azure_small.csv:8: TIMESTAMP='not-a-date' is not a datetime like "
      "'2023-11-16 18:15:46.6805900'",
  ]


def test_burstgpt_skips_and_counts_zero_responses():
  rows, problems = traces.read_burstgpt(BURSTGPT)
  assert [(r.line, r.arrival_s, r.prompt_len, r.output_len, r.tenant) for r in rows] == [
      (2, 0.0, 472, 18, "ChatGPT"), (4, 113.0, 417, 276, "GPT-4"), (9, 195.0, 64, 32, "GPT-4")]
  assert problems == [
      "burstgpt_small.csv:6: Request tokens='x' is not an integer",
      "burstgpt_small.csv:8: Response tokens=-2 must be >= 0",
      "burstgpt_small.csv: skipped 3 rows with 0 response tokens",
  ]


def test_mooncake_rows_and_problems():
  rows, problems = traces.read_mooncake(MOONCAKE)
  assert [r.line for r in rows] == [1, 2, 3, 4, 8]
  assert [r.arrival_s for r in rows] == [0.0, 0.25, 1.0, 1.5, 2.5]
  assert rows[1].hash_ids == (0, 2) and rows[1].prompt_len == 600
  assert problems == [
      "mooncake_small.jsonl:5: bad JSON (Expecting ',' delimiter at column 59)",
      "mooncake_small.jsonl:6: missing key 'input_length'",
      "mooncake_small.jsonl:7: expected a JSON object, got list",
  ]


def test_jsonl_rows_and_problems():
  rows, problems = traces.read_jsonl(JSONL, vocab_size=VOCAB)
  assert [(r.line, r.arrival_s, r.prompt_len, r.output_len) for r in rows] == [
      (1, 0.5, 4, 4), (2, 1.0, 10, 3), (3, 0.25, 6, 2), (10, 5.0, 8, 2)]
  assert rows[0].prompt_ids == (5, 6, 7, 8) and rows[0].tenant == "a"
  assert problems == [
      "trace_small.jsonl:4: missing key 'prompt_ids' or 'prompt_len'",
      "trace_small.jsonl:5: arrival_s=-1.0 must be >= 0",
      "trace_small.jsonl:6: missing key 'output_len'",
      "trace_small.jsonl:8: prompt_ids[1]=999 is not in [0, 128)",
      "trace_small.jsonl:9: session=7 is not a string",
  ]


@pytest.mark.parametrize("reader, path, lines", [
    (traces.read_azure, AZURE, [2, 3]), (traces.read_burstgpt, BURSTGPT, [2, 4]),
    (traces.read_mooncake, MOONCAKE, [1, 2]), (traces.read_jsonl, JSONL, [1, 2]),
])
def test_num_requests_keeps_first_good_rows(reader, path, lines):
  rows, _ = reader(path, num_requests=2)
  assert [r.line for r in rows] == lines


def test_header_without_columns_is_one_problem(tmp_path):
  path = tmp_path / "bad.csv"
  path.write_text("time,prompt\n1,2\n")
  assert traces.read_azure(str(path)) == (
      [], ["bad.csv:1: header 'time,prompt' lacks column(s) ['TIMESTAMP', 'ContextTokens', "
           "'GeneratedTokens']"])


def test_many_problems_are_counted_past_the_limit(tmp_path):
  path = tmp_path / "many.jsonl"
  path.write_text("{\n" * 60)
  rows, problems = traces.read_jsonl(str(path))
  assert rows == [] and len(problems) == 51
  assert problems[-1] == "many.jsonl: 10 more problem rows not listed"


def test_replay_sorts_ids_tokens_and_sampling():
  rows, _ = traces.read_jsonl(JSONL, vocab_size=VOCAB)
  requests, problems = play(rows, temperature=0.5, ignore_eos=True)
  assert problems == []
  assert [r.id for r in requests] == ["req-00000", "req-00001", "req-00002", "req-00003"]
  assert [r.arrival_s for r in requests] == [0.25, 0.5, 1.0, 5.0]
  assert [r.prompt_len for r in requests] == [6, 4, 10, 8]
  assert requests[1].prompt_ids == [5, 6, 7, 8] and requests[1].session == "s1"
  assert requests[0].tenant == "b"
  assert all(r.sampling.temperature == 0.5 and r.sampling.ignore_eos for r in requests)
  assert all(r.eos_ids == EOS for r in requests)
  synthesized = [t for r in requests if r.id != "req-00001" for t in r.prompt_ids]
  assert set(synthesized) <= set(range(1, VOCAB)) - set(EOS)
  again, _ = play(rows, temperature=0.5, ignore_eos=True)
  assert [r.prompt_ids for r in again] == [r.prompt_ids for r in requests]
  other, _ = play(rows, seed=1)
  assert [r.prompt_ids for r in other] != [r.prompt_ids for r in requests]


def test_time_scale_halves_gaps():
  rows, _ = traces.read_jsonl(JSONL, vocab_size=VOCAB)
  normal, _ = play(rows)
  fast, _ = play(rows, time_scale=0.5)
  assert [r.arrival_s for r in fast] == [0.25, 0.375, 0.625, 2.625]
  assert [b.arrival_s - a.arrival_s for a, b in zip(fast, fast[1:])] == pytest.approx(
      [(b.arrival_s - a.arrival_s) / 2 for a, b in zip(normal, normal[1:])])
  with pytest.raises(ValueError, match="time_scale must be a finite number > 0, got 0.0"):
    play(rows, time_scale=0.0)


def test_max_model_len_truncation_is_counted():
  rows, _ = traces.read_azure(AZURE)
  requests, problems = play(rows)
  assert [(r.prompt_len, r.sampling.max_new_tokens) for r in requests] == [
      (374, 44), (396, 109), (484, 28), (1, 511), (50, 20)]
  assert problems == [
      "t: truncated 2 of 5 requests to fit max_model_len=512 (max_new_tokens <= 511, prompt "
      "keeps its first max_model_len - max_new_tokens tokens)"]
  assert all(r.max_len <= 512 for r in requests)
  _, problems = play(rows, max_model_len=4096)
  assert problems == []


def test_mooncake_blocks_share_prefixes():
  rows, _ = traces.read_mooncake(MOONCAKE)
  requests, _ = play(rows, max_model_len=2048)
  first, second, fourth = requests[0].prompt_ids, requests[1].prompt_ids, requests[3].prompt_ids
  assert len(first) == 700 and len(second) == 600 and len(fourth) == 300
  assert first[:512] == second[:512] and first[512:600] != second[512:600]
  assert fourth == first[:300]
  assert requests[2].prompt_ids[:100] != first[:100]
  short, problems = play(rows)   # Truncated prompts keep their shared first block.
  assert short[0].prompt_ids == first[:492] and short[1].prompt_ids == first[:500]
  assert problems[0].startswith("t: truncated 2 of 5 requests")


def test_mooncake_small_blocks_scale_lengths():
  rows, _ = traces.read_mooncake(MOONCAKE, block_size=16)
  assert [r.prompt_len for r in rows] == [22, 19, 4, 10, 2]
  requests, problems = play(rows)
  assert problems == []
  first, second = requests[0].prompt_ids, requests[1].prompt_ids
  assert first[:16] == second[:16] and first[16:19] != second[16:19]
  with pytest.raises(ValueError, match=r"block_size must be in \[1, 512\], got 0"):
    traces.read_mooncake(MOONCAKE, block_size=0)


def test_replay_of_nothing():
  assert play([]) == ([], [])


def _write_jsonl(tmp_path, lines):
  path = tmp_path / "ids.jsonl"
  path.write_text("".join(line + "\n" for line in lines))
  return str(path)


def test_jsonl_rows_keep_their_own_ids(tmp_path):
  path = _write_jsonl(tmp_path, [
      '{"id": "conv-7", "arrival_s": 2.0, "prompt_len": 4, "output_len": 2}',
      '{"arrival_s": 0.0, "prompt_len": 4, "output_len": 2}',
      '{"id": "conv-3", "arrival_s": 1.0, "prompt_len": 4, "output_len": 2}',
      '{"arrival_s": 3.0, "prompt_len": 4, "output_len": 2}',
  ])
  rows, problems = traces.read_jsonl(path)
  assert problems == [] and [r.id for r in rows] == ["conv-7", "", "conv-3", ""]
  requests, _ = play(rows)
  # Sorted by arrival; rows without an id are named by their place in that order.
  assert [r.id for r in requests] == ["req-00000", "conv-3", "conv-7", "req-00003"]


def test_jsonl_duplicate_and_bad_ids_are_problems_and_skipped(tmp_path):
  path = _write_jsonl(tmp_path, [
      '{"id": "a", "arrival_s": 0.0, "prompt_len": 4, "output_len": 2}',
      '{"id": "b", "arrival_s": 0.5, "prompt_len": 4, "output_len": 2}',
      '{"id": "a", "arrival_s": 1.0, "prompt_len": 4, "output_len": 2}',
      '{"id": 7, "arrival_s": 1.5, "prompt_len": 4, "output_len": 2}',
      '{"id": "", "arrival_s": 2.0, "prompt_len": 4, "output_len": 2}',
      '{"id": "c", "arrival_s": 2.5, "prompt_len": 0, "output_len": 2}',
      '{"id": "c", "arrival_s": 3.0, "prompt_len": 4, "output_len": 2}',
  ])
  rows, problems = traces.read_jsonl(path)
  # A bad row does not claim its id: line 7 reuses the id of the skipped line 6.
  assert [(r.line, r.id) for r in rows] == [(1, "a"), (2, "b"), (7, "c")]
  assert problems == [
      "ids.jsonl:3: id='a' duplicates line 1",
      "ids.jsonl:4: id=7 is not a string",
      "ids.jsonl:5: id='' is empty",
      "ids.jsonl:6: prompt_len=0 must be >= 1",
  ]
  rows, _ = traces.read_jsonl(path, num_requests=2)
  assert [r.id for r in rows] == ["a", "b"]


def test_generated_ids_avoid_a_rows_own_id(tmp_path):
  path = _write_jsonl(tmp_path, [
      '{"arrival_s": 0.0, "prompt_len": 4, "output_len": 2}',
      '{"id": "req-00000", "arrival_s": 1.0, "prompt_len": 4, "output_len": 2}',
      '{"id": "req-00000.1", "arrival_s": 2.0, "prompt_len": 4, "output_len": 2}',
  ])
  requests, _ = play(traces.read_jsonl(path)[0])
  assert [r.id for r in requests] == ["req-00000.2", "req-00000", "req-00000.1"]
