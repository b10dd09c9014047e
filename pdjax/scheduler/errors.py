"""The failures the scheduler expects and survives. Pure Python.

An instance (real or simulated) raises `DeviceError` when a step or a KV transfer fails for a
reason outside the program's control: a device or runtime error (the real engine wraps
`jax.errors.JaxRuntimeError` in it), a lost device. The driver fails (or recovers) only the
requests that step or transfer held and keeps serving. Anything else — a TypeError, a
ValueError from a shape outside the buckets — is a programming error and propagates: the run
stops loudly instead of turning a bug into a quiet fallback.
"""


class DeviceError(RuntimeError):
  """A step or transfer failed on the device or in the runtime (expected; recoverable)."""


class InstanceLost(DeviceError):
  """The process that owned an instance's devices is gone (a Ray actor that died). The driver
  treats the instance as dead, exactly like an injected kill: its requests are recomputed on
  live instances of its tier or fail with the reason."""
