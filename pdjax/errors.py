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


class ReloadFailed(DeviceError):
  """A step's host-tier reloads did not arrive (their store is gone, or a sealed page from
  another node did not open): the step did not run, and its prompts start over without them
  (Collect._recompute_prefills)."""


class HostTierLost(ReloadFailed):
  """The node's KV store (the host tier's bytes under the Ray launcher) is gone: a step that
  needed reloads from it did not run. The driver stops using the tier for the rest of the run
  (HostTier.lose) and recovers the step's requests as after any failed step."""


class RemoteStoreLost(ReloadFailed):
  """Another node's KV store, which a step reloaded from (kv.remote_store), is gone or did not
  answer within STORE_TIMEOUT_S: that node's tier is lost for the rest of the run, as for
  HostTierLost. (A sealed page that does not open loses only that page:
  kv/remote_store.RemotePagesUnread.) args: (message, node)."""

  def __init__(self, message: str, node: int = 0):
    super().__init__(message, node)
    self.node = node

  def __str__(self) -> str:
    return self.args[0]


class StepNotRun(DeviceError):
  """A step dispatched ahead (overlap) on the device tokens of the step before it, which failed
  at dispatch in its instance's process: it was never launched (its input tokens do not
  exist). Nothing it planned happened; the driver plans its requests again (Collect)."""


class PullNotStarted(DeviceError):
  """A Ray KV pull the destination dropped before asking the source for the offer (the driver
  had given up on it): the offer was never taken, so it expires on the source."""
