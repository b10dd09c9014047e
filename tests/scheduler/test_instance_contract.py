"""Every implementation of the driver's instance interface satisfies the Protocols of
pdjax/scheduler/instance_contract.py, with signatures checked (parameter count, kinds and names
against the calls the driver makes), not just names; and the checker rejects a class that does
not. Classes are checked as classes (no devices, no actors); attributes set only at run time are
read from the class's source (`members`), and their values from a built SimInstance."""

import pytest

from pdjax.engine.host_copies import HostHandoff, transfer_through_host_tier
from pdjax.engine.instance import Instance, PendingTokens
from pdjax.engine.options import EngineOptions
from pdjax.engine.transfer import PendingTransfer, transfer_kv, transfer_kv_async
from pdjax.models.llama_config import PRESETS
from pdjax.scheduler import instance_contract as contract
from pdjax.scheduler.clock import ManualClock
from pdjax.scheduler.instance_queue import SlowPending
from pdjax.sim.host_handoff import via_host_tier
from pdjax.sim.instance import SimInstance, SimPending, build_sim_instances, sim_transfer
from pdjax.sim.transfer import SimTransfer

from helpers.fake_engine import FakeInstance, FakePending, ok_transfer

INSTANCES = [Instance, SimInstance]           # + RemoteInstance when ray is installed
STEPS = [PendingTokens, SimPending, SlowPending, FakePending]   # (+ Ray's PendingStart: a restart)
TRANSFERS = [PendingTransfer, HostHandoff, SimTransfer]
TRANSFER_FNS = [transfer_kv_async, transfer_kv, transfer_through_host_tier, sim_transfer,
                via_host_tier, ok_transfer]

try:
  from pdjax.distributed.ray_transfer import RayTransfer, RemoteTransfer
  from pdjax.distributed.remote import PendingStart, RemoteInstance, RemotePending
  INSTANCES.append(RemoteInstance)
  STEPS += [RemotePending, PendingStart]
  TRANSFERS.append(RemoteTransfer)
  TRANSFER_FNS.append(RayTransfer)
except ImportError:   # no ray here: the Ray backend is an extra
  pass


def _name(x):
  return getattr(x, "__name__", repr(x))


@pytest.mark.parametrize("cls", INSTANCES, ids=_name)
def test_instances_are_served_instances(cls):
  assert contract.problems(cls, contract.ServedInstance, contract.OPTIONAL_INSTANCE) == []


def test_the_fake_is_what_the_driver_needs():
  """The tests' fake drives the Driver directly: the driver's own Protocol, not the run's."""
  assert contract.problems(FakeInstance, contract.Instance, contract.OPTIONAL_INSTANCE) == []
  assert contract.problems(FakeInstance, contract.ServedInstance) == [
      "FakeInstance: no attribute 'role' (ServedInstance)",
      "FakeInstance: no attribute 'opts' (ServedInstance)",
      "FakeInstance: no attribute 'compiles' (ServedInstance)"]


def test_a_built_sim_instance_and_its_pending_objects():
  """Values, not only names: a SimInstance as a run builds it, a step and a transfer of it."""
  clock = ManualClock()
  opts = EngineOptions(page_size=16, num_pages=64, max_model_len=256, prefill_buckets=(256,),
                       max_prefill_seqs=4, decode_buckets=(8,))
  src, dst = build_sim_instances([("prefill", 1, 1), ("decode", 1, 1)], PRESETS["tiny"], opts,
                                 hardware="a100", clock=clock)
  assert isinstance(src, contract.ServedInstance)     # runtime_checkable: names only
  assert contract.problems(SimInstance, contract.ServedInstance, contract.OPTIONAL_INSTANCE,
                           instance=src) == []
  src.tables.allocate("r", 20)
  step = src.prefill([([5] * 20, 0, src.tables.block_table("r"), 0.0, 0, 1.0)])
  assert contract.problems(SimPending, contract.PendingStep, contract.OPTIONAL_PENDING,
                           instance=step) == []
  dst.tables.allocate("r", 20)
  step.result()
  moving = sim_transfer(src, src.tables.block_table("r"), dst, dst.tables.block_table("r"))
  assert contract.problems(SimTransfer, contract.PendingTransfer, contract.OPTIONAL_PENDING,
                           instance=moving) == []
  assert isinstance(moving.result(), contract.TransferLanded)


@pytest.mark.parametrize("cls", STEPS, ids=_name)
def test_pending_steps(cls):
  assert contract.problems(cls, contract.PendingStep, contract.OPTIONAL_PENDING) == []


@pytest.mark.parametrize("cls", TRANSFERS, ids=_name)
def test_pending_transfers(cls):
  assert contract.problems(cls, contract.PendingTransfer, contract.OPTIONAL_PENDING) == []


@pytest.mark.parametrize("fn", TRANSFER_FNS, ids=_name)
def test_transfer_functions(fn):
  assert contract.transfer_fn_problems(fn) == []


# ---- the checker can fail --------------------------------------------------------------------


class _Pending:
  def ready(self):
    return True

  def result(self):
    return []


class _WrongSteps:
  """Overlaps (device_tokens) but its steps take no prev; decode wants a keyword it never
  gets; it has no tables; its kill takes an argument the driver does not pass."""
  device_tokens = True

  def __init__(self):
    self.name = "x"

  def prefill(self, seqs):
    return _Pending()

  def decode(self, seqs, *, batch):
    return _Pending()

  def kill(self, why):
    pass


def test_the_checker_rejects_wrong_signatures():
  found = contract.problems(_WrongSteps, contract.Instance, contract.OPTIONAL_INSTANCE)
  assert any("no attribute 'tables'" in p for p in found)
  assert any(p.startswith("_WrongSteps.prefill(seqs)") and "2 positional" in p for p in found)
  assert [p.split(":")[1] for p in found if p.startswith("_WrongSteps.decode(")] == [
      " cannot take the 1 positional arguments (seqs) the driver may pass",
      " cannot take the 2 positional arguments (seqs, prev) the driver may pass"]
  assert any(p.startswith("_WrongSteps.kill(why)") for p in found)
  assert len(found) == 5, found
  # without device_tokens the driver never passes prev: seqs alone is then enough
  _WrongSteps.device_tokens = False
  try:
    found = contract.problems(_WrongSteps, contract.Instance, contract.OPTIONAL_INSTANCE)
    assert not any(p.startswith("_WrongSteps.prefill") for p in found)
  finally:
    _WrongSteps.device_tokens = True


def test_the_checker_rejects_wrong_names_and_kinds():
  def swapped(src, dst, src_pages, dst_pages):
    pass

  def three(src, src_pages, dst):
    pass

  assert contract.transfer_fn_problems(swapped) == [
      "swapped(src, dst, src_pages, dst_pages): parameter 'dst' is 'src_pages' in the contract",
      "swapped(src, dst, src_pages, dst_pages): parameter 'src_pages' is 'dst' in the contract"]
  assert len(contract.transfer_fn_problems(three)) == 1

  class NoResult:
    end_s = "soon"

    def ready(self):
      return False

  assert contract.problems(NoResult, contract.PendingTransfer, contract.OPTIONAL_PENDING) == [
      "NoResult: no method result() (PendingTransfer)",
      "NoResult.end_s = 'soon': not (<class 'int'>, <class 'float'>)"]
