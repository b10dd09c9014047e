"""What a Driver's run returns (RunResult): the requests, transfers, step and state records,
role switches, faults, re-meshes and KV audit of one run. Pure Python."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from pdjax.metrics import columns
from pdjax.request import Request
from pdjax.scheduler.tally import Tally


@dataclasses.dataclass
class RunResult:
  requests: list[Request]
  transfers: list[dict]
  duration_s: float
  steps: Sequence[dict]      # one per executed step (see Driver._collect; fields:
                             # scheduler/records.py STEP_FIELDS; a RecordTable unless spilled)
  samples: Sequence[dict]    # worker state: at each dispatch and wherever it changed since
                             # (Driver._record_state; SAMPLE_FIELDS)
  role_switches: list[dict]
  preemptions: int
  flushes: list[dict] = dataclasses.field(default_factory=list)   # {"t_s", "tenant", "pages"}
  faults: dict = dataclasses.field(default_factory=dict)   # injected and recovery counts
  fast_forwarded: int = 0    # steps collected by the decode fast-forward (not an output)
  tally: Tally = dataclasses.field(default_factory=Tally)   # counters as they happened
  segment_steps: int = 0     # fast-forwarded steps collected in decode segments (not an output)
  remesh_events: list[dict] = dataclasses.field(default_factory=list)   # one per re-mesh
                             # (scheduler/remesh.py): layouts, phases' seconds, moved requests
  instances: list = dataclasses.field(default_factory=list)   # every instance the run used,
                             # those a re-mesh replaced and made included
  kv_audit: Sequence[dict] = dataclasses.field(default_factory=list)   # kv_audit.jsonl's
                             # lines (kv/audit.py; empty without the prefix cache)

  def step_counts(self) -> dict[str, dict[str, int]]:
    """{instance: {kind: steps}}, both in order of first appearance."""
    counts: dict[str, dict[str, int]] = {}
    (inst, inst_names), (kind, kind_names) = (columns.codes(self.steps, "instance"),
                                              columns.codes(self.steps, "kind"))
    pairs = inst * len(kind_names) + kind
    unique, first, n = np.unique(pairs, return_index=True, return_counts=True)
    for i in np.argsort(first, kind="stable").tolist():
      pair = int(unique[i])
      per = counts.setdefault(inst_names[pair // len(kind_names)], {})
      per[kind_names[pair % len(kind_names)]] = int(n[i])
    return counts
