"""The simulator's outputs equal the committed golden snapshots, field for field (see
tests/helpers/sim_snapshots.py for the three configs and how to regenerate after an intended change)."""

import json

import pytest

from helpers import sim_snapshots


@pytest.mark.parametrize("name", sorted(sim_snapshots.CONFIGS))
def test_sim_outputs_equal_the_golden_snapshot(name):
  with open(sim_snapshots.path(name)) as f:
    golden = json.load(f)
  got = sim_snapshots.take(name)
  assert sorted(got) == sorted(golden)
  for run in golden:
    assert got[run]["requests"] == golden[run]["requests"], f"{name}/{run}: requests differ"
    assert got[run]["summary"] == golden[run]["summary"], f"{name}/{run}: summary differs"
