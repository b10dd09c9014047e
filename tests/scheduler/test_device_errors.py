"""A runtime failure of a step or a KV transfer reaches the driver as DeviceError (the one failure
it survives), chained to the JaxRuntimeError; programming errors propagate unwrapped."""

import jax
import jax.numpy as jnp
import pytest

from conftest import tiny_engine_options
from pdjax.engine import transfer
from pdjax.engine.cluster import build_instances
from pdjax.engine.instance import PendingTokens
from pdjax.errors import DeviceError


def _lost(*_):
  raise OSError("device lost")


# A real runtime failure: a jitted program whose host callback raises (JaxRuntimeError on CPU).
_failing = jax.jit(lambda *args: jax.pure_callback(
    _lost, jax.ShapeDtypeStruct((4,), jnp.int32), jnp.zeros(4, jnp.int32)))


class _FailedArray:
  """A dispatched result whose computation failed on the device."""

  def is_ready(self):
    raise jax.errors.JaxRuntimeError("INTERNAL: the step failed")

  block_until_ready = __array__ = is_ready


@pytest.fixture(scope="module")
def inst(tiny_model):
  cfg, params = tiny_model
  return build_instances([("colocated", 1, 1)], cfg, params, tiny_engine_options())[0]


def test_failed_step_dispatch_is_a_device_error(inst, monkeypatch):
  monkeypatch.setitem(inst._prefill, 32, lambda params, kv, b, prev: (_failing(), kv))
  with pytest.raises(DeviceError, match=r"^JaxRuntimeError: INTERNAL: CpuCallback error") as e:
    inst.prefill([([5, 6, 7], 0, [0], 0.0, 1)])
  assert type(e.value.__cause__) is jax.errors.JaxRuntimeError


def test_failed_step_result_is_a_device_error():
  pending = PendingTokens(_FailedArray(), 1)
  for call in (pending.ready, pending.result):
    with pytest.raises(DeviceError, match="^JaxRuntimeError: INTERNAL: the step failed$"):
      call()


def test_programming_errors_are_not_wrapped(inst, monkeypatch):
  with pytest.raises(ValueError, match="^200 exceeds the largest bucket 128$"):
    inst.prefill([([5] * 200, 0, [0], 0.0, 1)])
  with pytest.raises(ValueError, match="^9 exceeds the largest bucket 8$"):
    inst.decode([(5, 0, [0], 0.0, 1)] * 9)
  monkeypatch.setitem(inst._decode, 4, lambda *a: _lost())
  with pytest.raises(OSError, match="^device lost$"):
    inst.decode([(5, 0, [0], 0.0, 1)])


def test_failed_transfer_dispatch_and_landing_are_device_errors(inst, monkeypatch):
  monkeypatch.setitem(inst._gather, (1, inst.tp), (lambda kv, ids: _failing(), []))
  with pytest.raises(DeviceError, match=r"^JaxRuntimeError: INTERNAL: CpuCallback error"):
    transfer.transfer_kv_async(inst, [3], inst, [4])
  with pytest.raises(ValueError, match="^page counts differ: 1 source, 2 destination$"):
    transfer.transfer_kv_async(inst, [3], inst, [4, 5])
  pending = transfer.PendingTransfer(_FailedArray(), start=0.0)
  for call in (pending.ready, pending.result):
    with pytest.raises(DeviceError, match="^JaxRuntimeError: INTERNAL: the step failed$"):
      call()
