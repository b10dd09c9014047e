"""The host-tier tests' hand-built trace (tests/kv, tests/distributed): r0 (tenant a) caches X,
64 tokens = 4 full pages of 16; three fillers of 112 tokens at 1, 2 and 3 s evict X's pages
from a 16-page pool; r4, X plus 16 new tokens at 4 s (tenant `last_tenant`), finds them in the
host tier. With `hit_at`, another request takes X's 4 pages at that time (its own fifth page
is new)."""

import json
import random

X = [random.Random(0).randrange(3, 500) for _ in range(64)]


def trace_rows(last_tenant: str = "a", hit_at: float | None = None) -> list[dict]:
  rng = random.Random(1)
  rows = [{"arrival_s": 0.0, "prompt_ids": X, "output_len": 1, "tenant": "a"}]
  if hit_at is not None:
    rows.append({"arrival_s": hit_at, "prompt_ids": X + [9] * 16, "output_len": 1,
                 "tenant": "a"})
  rows += [{"arrival_s": float(i), "prompt_ids": [rng.randrange(3, 500) for _ in range(112)],
            "output_len": 1, "tenant": "a"} for i in (1, 2, 3)]
  rows.append({"arrival_s": 4.0, "prompt_ids": X + [7] * 16, "output_len": 4,
               "tenant": last_tenant})
  return rows


def write_trace(path, rows: list[dict]) -> None:
  with open(path, "w") as f:
    f.write("".join(json.dumps(r) + "\n" for r in rows))
