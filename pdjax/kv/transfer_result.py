"""What one KV transfer cost: shared by the real (jax) and simulated backends. Pure Python."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class TransferResult:
  bytes: int        # bytes moved
  seconds: float    # gather start -> pages landed on the destination
  group_ends_s: tuple[float, ...] = ()   # streamed by layer groups (kv.stream_layers): each
                                         # group's landing, seconds after the first group's
                                         # dispatch (the step's), as observed
