"""The fields of a run's step records and state samples (RunResult.steps, .samples), and the
containers the driver keeps them in: a RecordTable (numpy columns, metrics/record_table.py)
or, for a long-lived server run, a SpilledRecords (scheduler/spill.py). Producers add rows as
tuples in field order (`add`); readers see dicts with these keys, in this order. Pure Python.
"""

from __future__ import annotations

from pdjax.metrics.record_table import Field, RecordTable
from pdjax.scheduler.spill import SpilledList

STEP_FIELDS = (
    Field("instance", "str"), Field("role", "str"), Field("kind", "str"),
    Field("start_s", "float"), Field("end_s", "float"),
    Field("num_seqs", "int"), Field("num_tokens", "int"), Field("ahead", "bool"),
    Field("dispatched_s", "float"), Field("done_s", "float"), Field("plan_s", "float"),
    Field("dispatch_s", "float"), Field("build_s", "float"), Field("readback_s", "float"),
    Field("host_wait_s", "float"))

SAMPLE_FIELDS = (
    Field("t", "float"), Field("instance", "str"), Field("role", "str"),
    Field("queued", "int"), Field("running", "int"), Field("kv_pages_used", "int"),
    Field("kv_pages_total", "int"), Field("kv_pages_cached", "int"),
    Field("kv_slots_unused", "int"),
    Field("host_tier_pages", "int", optional=True))   # with a node host KV tier only

SAMPLE_STATE = slice(2, 8)   # role .. kv_pages_cached: the state a new sample must differ in
                             # from the latest (InstanceQueue.record_state_change)


class SpilledRecords(SpilledList):
  """A SpilledList of record dicts that takes rows like a RecordTable."""

  def __init__(self, path: str, fields):
    super().__init__(path)
    self.fields = tuple(fields)

  def add(self, row: tuple) -> None:
    self.append({f.name: v for f, v in zip(self.fields, row)
                 if v is not None or not f.optional})

  def flush_if_full(self) -> None:
    pass   # (SpilledList spills as it appends)

  def last_row(self) -> tuple:
    record = self[-1]
    return tuple(record.get(f.name) for f in self.fields)


def new_records(fields, spill_path: str | None):
  return RecordTable(fields) if spill_path is None else SpilledRecords(spill_path, fields)
