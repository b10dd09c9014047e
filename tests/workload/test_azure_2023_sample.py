"""The shipped sample of the Azure LLM inference trace 2023 (tests/fixtures/azure_llm_2023/: the
first 1,000 rows of the code and conversation traces) read as a run reads it: workload.kind=azure,
workload.path=FILE, through the loader and pdjax.workload.traces.read_azure."""

import os

import pytest

from helpers.paths import FIXTURES
from pdjax import config as config_lib
from pdjax.workload.loader import load_workload
from pdjax.workload.traces import read_azure

SAMPLE = os.path.join(FIXTURES, "azure_llm_2023")


def _load(name: str):
  cfg = config_lib.load_config_module("configs/default.py").get_config()
  cfg.workload.kind, cfg.workload.path = "azure", os.path.join(SAMPLE, name)
  cfg.workload.num_requests = 0                    # every row
  return load_workload(cfg.workload, seed=0, vocab_size=128, eos_ids=(2,), max_model_len=8192)


# name: (first two rows, last two rows) as (arrival s, context tokens, generated tokens); the
# published file's rows 2, 3, 1,000 and 1,001, arrivals from its first TIMESTAMP.
ENDS = {
    "code_first_1000.csv": ([(0.0, 4808, 10), (0.052, 3180, 8)],
                            [(521.583657, 999, 26), (521.588576, 94, 54)]),
    "conv_first_1000.csv": ([(0.0, 374, 44), (4.314579, 396, 109)],
                            [(215.846596, 399, 91), (216.027393, 309, 18)]),
}


@pytest.mark.parametrize("name", sorted(ENDS))
def test_the_sample_loads_every_row_as_recorded(name):
  requests, problems = _load(name)
  assert problems == []
  assert len(requests) == 1000
  first, last = ENDS[name]
  got = [(r.arrival_s, len(r.prompt_ids), r.sampling.max_new_tokens)
         for r in requests[:2] + requests[-2:]]
  assert [g[1:] for g in got] == [e[1:] for e in first + last]
  assert [g[0] for g in got] == pytest.approx([e[0] for e in first + last], abs=1e-9)


def test_the_samples_totals():
  """Totals over the 1,000 rows (nothing clipped: every row fits 8,192 tokens), so a row lost or
  changed shows."""
  totals = {}
  for name in sorted(ENDS):
    rows, problems = read_azure(os.path.join(SAMPLE, name))
    assert problems == [] and [r.line for r in rows] == list(range(2, 1002))
    totals[name] = (sum(r.prompt_len for r in rows), sum(r.output_len for r in rows),
                    max(r.prompt_len + r.output_len for r in rows))
  assert totals == {"code_first_1000.csv": (2122354, 27621, 7574),
                    "conv_first_1000.csv": (1014189, 247262, 4292)}
