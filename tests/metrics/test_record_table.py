"""RecordTable (metrics/record_table.py): a run's records as numpy columns read back as the
exact dicts they were added as; the column readers (metrics/columns.py) give on a table what
they give on the list of those dicts."""

import json
import random

import numpy as np
import pytest

from pdjax.metrics import columns
from pdjax.metrics.record_table import BLOCK, Field, RecordTable
from pdjax.metrics.timeline import tier_stats
from pdjax.scheduler.records import SAMPLE_FIELDS, STEP_FIELDS
from pdjax.scheduler.segment_records import SegmentRecords

FIELDS = (Field("name", "str"), Field("t", "float"), Field("n", "int"), Field("on", "bool"),
          Field("extra", "int", optional=True))


def _record(rng: random.Random, i: int) -> dict:
  r = {"name": rng.choice(["b", "a", "c"]), "t": rng.uniform(0, 5), "n": i, "on": i % 3 == 0}
  if i % 4 == 0:
    r["extra"] = rng.randint(0, 9)
  return r


def _row(r: dict) -> tuple:
  return (r["name"], r["t"], r["n"], r["on"], r.get("extra"))


def test_rows_and_columns_read_back_as_the_dicts_added():
  """Rows across several flushes and a block added by column read back equal, key order and
  types included (json of both is the same text); an absent optional field is absent."""
  rng = random.Random(0)
  table, expected = RecordTable(FIELDS), []
  for i in range(2 * BLOCK + 7):
    r = _record(rng, i)
    expected.append(r)
    table.add(_row(r))
    table.flush_if_full()
  assert table.last_row() == _row(expected[-1])        # still a buffered row
  table.extend(3, {"name": "z", "t": [0.5, 1.5, 2.5], "n": [7, 8, 9], "on": True, "extra": None})
  expected += [{"name": "z", "t": t, "n": n, "on": True} for t, n in ((0.5, 7), (1.5, 8),
                                                                        (2.5, 9))]
  table.append({"name": "a", "t": 1.0, "n": 1, "on": False, "extra": 4})
  expected.append({"name": "a", "t": 1.0, "n": 1, "on": False, "extra": 4})
  assert len(table) == len(expected) == 2 * BLOCK + 11
  assert json.dumps(list(table)) == json.dumps(expected)
  assert table[-1] == expected[-1] and table[5] == expected[5]
  assert table[3:6] == expected[3:6] and table[::1000] == expected[::1000]
  table.flush()
  assert table.last_row() == ("a", 1.0, 1, False, 4)
  assert table == expected and table != expected[:-1]


def test_column_readers_give_what_they_give_on_dicts():
  rng = random.Random(1)
  records = [_record(rng, i) for i in range(50)]
  table = RecordTable(FIELDS)
  for r in records:
    table.add(_row(r))
  for key in ("t", "n", "on"):
    assert columns.numbers(table, (key,))[0].tolist() == columns.numbers(records, (key,))[0].tolist()
  assert (columns.numbers(table, ("extra",), {"extra": -1.0})[0].tolist()
          == columns.numbers(records, ("extra",), {"extra": -1.0})[0].tolist())
  with pytest.raises(KeyError):
    columns.numbers(table, ("extra",))
  with pytest.raises(KeyError):
    columns.numbers(table, ("missing",))
  codes, names = columns.codes(table, "name")
  want_codes, want_names = columns.codes(records, "name")
  assert names == want_names == ["a", "b", "c"] and codes.tolist() == want_codes.tolist()
  assert columns.present(table, "extra").tolist() == columns.present(records, "extra").tolist()
  assert not columns.present(table, "missing").any()
  view = table.column("t")
  assert not view.flags.writeable


def test_bad_rows_and_blocks_are_refused():
  table = RecordTable(FIELDS)
  with pytest.raises(KeyError, match=r"fields not in this table: \['bogus'\]"):
    table.append({"name": "a", "t": 0.0, "n": 0, "on": False, "bogus": 1})
  with pytest.raises(KeyError, match="extend needs exactly the fields"):
    table.extend(1, {"name": "a"})
  with pytest.raises(IndexError, match="cannot truncate 0 rows to 1"):
    table.truncate(1)
  with pytest.raises(ValueError, match="tail must share this table's code books"):
    table.take_from(0, np.arange(0), RecordTable(FIELDS))
  with pytest.raises(ValueError, match="field x: only numeric fields may be optional"):
    Field("x", "str", optional=True)


def test_take_from_reorders_the_tail_with_another_tables_rows():
  table = RecordTable(FIELDS)
  for i in range(4):
    table.add(("a", float(i), i, False, None))
  other = table.empty_like()
  other.add(("new", 9.0, 9, True, 1))
  table.take_from(2, np.array([2, 0, 1]), other)
  assert [r["n"] for r in table] == [0, 1, 9, 2, 3]
  assert table[2] == {"name": "new", "t": 9.0, "n": 9, "on": True, "extra": 1}
  table.truncate(1)
  assert list(table) == [{"name": "a", "t": 0.0, "n": 0, "on": False}]


def test_tier_stats_of_a_table_equal_those_of_its_dicts():
  rng = random.Random(2)
  steps, samples = RecordTable(STEP_FIELDS), RecordTable(SAMPLE_FIELDS)
  for _ in range(300):
    a = rng.uniform(0, 10)
    steps.add((rng.choice("xy"), rng.choice(["prefill", "decode"]), rng.choice(["decode", "mixed"]),
               a, a + rng.uniform(0, 1), rng.randint(1, 8), rng.randint(1, 300), False, a, a,
               0.0, 0.0, 0.0, 0.0, 0.0))
    samples.add((rng.uniform(0, 10), rng.choice("xy"), rng.choice(["prefill", "decode"]),
                 rng.randint(0, 5), rng.randint(0, 5), rng.randint(0, 30), 30, 0, 0, None))
  assert tier_stats(steps, samples, 10.0) == tier_stats(list(steps), list(samples), 10.0)


def test_segment_records_merge_into_their_windows_in_one_step_order():
  """Segments' rows join the run's rows of their window by (time, worker), the segments'
  first on ties; rows outside a window keep their places."""
  steps, samples = RecordTable(STEP_FIELDS), RecordTable(SAMPLE_FIELDS)

  def step(name, start, end):
    return (name, "decode", "decode", start, end, 1, 1, False, start, end, 0.0, 0.0, 0.0, 0.0,
            0.0)
  steps.add(step("w1", 0.0, 1.0))                  # before the window
  made = SegmentRecords()
  steps.add(step("w1", 1.0, 2.0))                  # the fast-forward's own, in the window
  steps.add(step("w0", 1.5, 3.0))
  steps.add(step("w0", 1.9, 2.0))                  # ties a segment's step: after it
  made.add("w0", "decode", 2, 2, 64, 0, [0.5, 1.0, 2.0], [1.0, 2.0], [3, 3, 4], [5, 4, 3])
  made.close_window((1, 0), (len(steps), len(samples)))
  steps.add(step("w0", 0.1, 0.2))                  # after the window: stays last
  made.merge_into(steps, samples, {"w0": 0, "w1": 1})
  assert [(s["instance"], s["end_s"], s["num_seqs"]) for s in steps] == [
      ("w1", 1.0, 1), ("w0", 1.0, 2), ("w0", 2.0, 2), ("w0", 2.0, 1), ("w1", 2.0, 1),
      ("w0", 3.0, 1), ("w0", 0.2, 1)]
  assert [(s["t"], s["kv_pages_used"], s["kv_slots_unused"], s["running"]) for s in samples] == [
      (0.5, 3, 5, 2), (1.0, 3, 4, 2), (2.0, 4, 3, 2)]
  assert "host_tier_pages" not in samples[0]
