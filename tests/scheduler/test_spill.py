"""scheduler/spill.py: an append-only list that keeps its newest items in memory and pickles
the rest to a file, reading them back exactly, in order."""

import os

import pytest

from pdjax.request import Request, SamplingParams, Status
from pdjax.scheduler.spill import SpilledList


def test_items_read_back_in_order_with_at_most_twice_keep_in_memory(tmp_path):
  items = SpilledList(str(tmp_path / "steps.pkl"), keep=3)
  for i in range(14):
    items.append({"i": i})
    assert len(items._tail) < 6 and len(items) == i + 1
  assert items._spilled == 9 and len(items._tail) == 5   # 3 spilled whenever 6 are held
  assert [x["i"] for x in items] == list(range(14))
  assert [x["i"] for x in items.since(4)] == list(range(4, 14))
  assert [x["i"] for x in items.since(12)] == [12, 13]
  assert (items[0]["i"], items[5]["i"], items[-1]["i"]) == (0, 5, 13)
  assert [x["i"] for x in items[2:11:3]] == [2, 5, 8]
  with pytest.raises(IndexError, match="index 14 out of range for 14 items"):
    items[14]
  items.close()
  assert not os.path.exists(tmp_path / "steps.pkl") and len(items) == 0


def test_the_latest_item_stays_in_memory_and_changes_stick(tmp_path):
  items = SpilledList(str(tmp_path / "samples.pkl"), keep=1)
  for i in range(5):
    items.append({"i": i})
    items[-1]["host_tier_pages"] = i      # the driver amends its latest sample
  assert [x["host_tier_pages"] for x in items] == [0, 1, 2, 3, 4]


def test_requests_come_back_equal(tmp_path):
  items = SpilledList(str(tmp_path / "requests.pkl"), keep=1)
  reqs = []
  for i in range(4):
    r = Request(f"r{i}", 0.5 * i, [1, 2, 3], SamplingParams(max_new_tokens=2, seed=i))
    r.add_token(5, 1.0 + i)
    r.finish(Status.FINISHED, 1.0 + i)
    reqs.append(r)
    items.append(r)
  back = list(items)
  assert [r.to_record() for r in back] == [r.to_record() for r in reqs]
  assert [r.sampling_seed for r in back] == [0, 1, 2, 3]


def test_keep_must_be_positive(tmp_path):
  with pytest.raises(ValueError, match="keep must be at least 1, got 0"):
    SpilledList(str(tmp_path / "x.pkl"), keep=0)
