"""The `faults` object of summary.json: what was injected, what recovered, what fell back,
what failed and why, what clients cancelled, and what was reclaimed (pure Python).

injected: {kind: count} (transfer_fail, transfer_delay, slow_step, kill_instance, cancel);
transfer_retries / transfers_recovered: failed attempts retried / transfers that succeeded
after failing; fell_back: {fallback: requests} from each request's `fallbacks`, and
fell_back_requests (requests with any); failed: {reason with numbers as '#': count};
cancelled and cancelled_by_stage; pages_reclaimed_by_lease, pages_lost_with_instances,
instances_killed, instances_restarted; and, only when they happen, restarts_failed (a
restarted instance's new process did not start: it stays dead) and steps_not_run (steps
dispatched ahead on the tokens of a step that failed at dispatch; their requests re-planned)
and transfer_errors ({device error: failed attempts}, e.g. a sealed piece that did not open).
"""

from __future__ import annotations

import collections
import re

from pdjax.metrics.timeline import reason_key
from pdjax.request import Status

_STAGE = re.compile(r"cancelled by the client \((\w+)\)")


def fault_summary(requests, counts: dict) -> dict:
  fell_back = collections.Counter(f for r in requests for f in set(r.fallbacks))
  failed = collections.Counter(reason_key(r.reason) for r in requests
                               if r.status == Status.FAILED)
  cancelled = [r for r in requests if r.status == Status.CANCELLED]
  stages = collections.Counter((_STAGE.match(r.reason) or [None, "client"])[1]
                               for r in cancelled)
  return {
      **counts,
      "injected": dict(counts.get("injected", {})),
      "fell_back": dict(sorted(fell_back.items())),
      "fell_back_requests": sum(1 for r in requests if r.fallbacks),
      "failed": dict(sorted(failed.items(), key=lambda kv: (-kv[1], kv[0]))),
      "cancelled": len(cancelled),
      "cancelled_by_stage": dict(sorted(stages.items())),
  }
