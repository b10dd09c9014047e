"""What one KV transfer cost: shared by the real (jax) and simulated backends. Pure Python."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class TransferResult:
  bytes: int        # bytes moved
  seconds: float    # gather start -> pages landed on the destination
