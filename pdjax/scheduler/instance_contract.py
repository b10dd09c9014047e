"""What the driver needs from an instance, its pending step, its pending transfer and the
transfer function: the interface every backend implements, stated as `typing.Protocol`s.

Implementations: `engine.instance.Instance` (devices, jax), `sim.instance.SimInstance` (a cost
model on a virtual clock), `distributed.remote.RemoteInstance` (an instance in a Ray actor) and
the tests' `FakeInstance` (tests/helpers/fake_engine.py);
tests/scheduler/test_instance_contract.py checks each against these Protocols, signatures
included, with `problems()` below. Stdlib only (no jax): the driver and the policies are host
logic.

pdjax's words and the field's:
  Instance.decode()  one batched decode step: JetStream's `generate`, one step of vLLM's model
                     runner (`execute_model`); it dispatches and returns at once.
  Instance.prefill() the ragged prefill (prompts, prompt chunks, mixed with decode rows):
                     JetStream's `prefill` + `insert` in one call (the KV is written in place).
  PendingStep        the step in flight (a future): JetStream's result tokens, not yet on host.
  transfer_fn        moving a request's KV pages from a prefill to a decode instance: a KV
                     connector's send/receive (vLLM), sglang's KVSender/KVReceiver pair, as
                     one call that returns a PendingTransfer.
  Driver             the scheduler loop (scheduler/driver.py), the same for every backend.
  InstanceQueue             the scheduler's host-side view of one instance (queues, load signals;
                     scheduler/instance_queue.py), not vLLM's worker process.
  BlockTables        the block manager (kv/pages.py): the instance's pages, owned by the host.

Required (the Protocols' own members):
  Instance         name, tables, prefill(seqs, prev=None), decode(seqs, prev=None)
  ServedInstance   + role, opts, compiles (what a run and the server read besides)
  PendingStep      ready(), result() -> tokens
  PendingTransfer  ready(), result() -> TransferLanded (bytes, seconds)
  TransferFn       (src, src_pages, dst, dst_pages) -> PendingTransfer (or TransferLanded)
Optional (read with getattr, or only on some paths; listed with what each must be, a type or a
signature, in OPTIONAL_INSTANCE and OPTIONAL_PENDING, and checked where present):
  instance         device_tokens, streams_kv, overlap_by_default, compiles_from_cache,
                   lazy_compiles, host_page_weight, handoff, host_stats, host, kill(), restart(),
                   attach_host_tier(), kv_bytes()
  pending          end_s, build_s, dispatch_s, inner, wait_any(pendings, timeout_s)
Not in the contract: what one backend's own parts read (the engine's host_copies and
warm_up, read by its transfer functions and builder; the simulator's clock, cost, digests).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
  from pdjax.kv.pages import BlockTables


@runtime_checkable
class TransferLanded(Protocol):
  """What a landed transfer reports (kv.transfer_result.TransferResult): the driver records
  bytes and seconds on the request and in the run's transfers."""
  bytes: int
  seconds: float


@runtime_checkable
class PendingStep(Protocol):
  """A dispatched step. ready() must not block; result() blocks for the host tokens, one per
  row in the order of the call's seqs, and raises pdjax.errors.DeviceError (InstanceLost,
  StepNotRun) for a step that failed. Optional: OPTIONAL_PENDING."""

  def ready(self) -> bool: ...

  def result(self) -> list[int]: ...


@runtime_checkable
class PendingTransfer(Protocol):
  """A dispatched transfer: ready() once every page landed on the destination (must not
  block), result() waits for that. Optional: OPTIONAL_PENDING (end_s, wait_any)."""

  def ready(self) -> bool: ...

  def result(self) -> TransferLanded: ...


@runtime_checkable
class Instance(Protocol):
  """What the driver itself reads (scheduler/*.py): a name, the host-side block tables of the
  instance's page pool, and the two steps. seqs rows: prefill (token_ids, start, pages,
  temperature, seed, top_p), decode (token, position, pages, temperature, seed, top_p).
  `prev` (the step in flight here, whose tokens a row's PendingToken reads) is passed only to
  an instance whose `device_tokens` is true; others may take seqs alone. `streams` (kv.stream_
  layers: [(decode instance, source pages, destination pages)] whose KV travels by layer
  groups while the step runs; the result's `streams` then holds their PendingTransfers) is
  passed only to an instance whose `streams_kv` is true (scheduler/streams.py)."""
  name: str
  tables: BlockTables

  def prefill(self, seqs: list, prev: PendingStep | None = None) -> PendingStep: ...

  def decode(self, seqs: list, prev: PendingStep | None = None) -> PendingStep: ...


@runtime_checkable
class ServedInstance(Instance, Protocol):
  """An instance as a run or the server builds the driver from it (runner/, server/): also
  its role ("prefill", "decode" or "colocated"), its engine.options.EngineOptions (page
  geometry, buckets: the driver's options come from the first instance's) and the programs it
  compiled (summary.json's compiles)."""
  role: str
  opts: Any
  compiles: int


class TransferFn(Protocol):
  """The run's transfer function: copies src_pages of src's pool into dst_pages of dst's
  (as many pages each) and returns a PendingTransfer (or, for a synchronous one, what landed).
  engine.transfer.transfer_kv_async, engine.host_copies.transfer_through_host_tier,
  sim.instance.sim_transfer, distributed.ray_transfer.RayTransfer."""

  def __call__(self, src: Instance, src_pages: list[int], dst: Instance,
               dst_pages: list[int]) -> PendingTransfer | TransferLanded: ...


# ---- optional members: {name: a type its value must be, or a function giving the signature} --


def _kill(self) -> None:
  """Ends the instance's process (a Ray actor) when the driver declares it dead."""


def _restart(self) -> PendingStep:
  """Starts a fresh process after a kill; the driver polls the returned pending start."""


def _attach_host_tier(self, tier, host_bytes_per_s: float, handoff: str) -> None:
  """Shares the node's host KV tier (kv.host_tier_pages; the run passes all three)."""


def _kv_bytes(self, num_pages: int) -> float:
  """Bytes num_pages of this pool hold (metrics/kv_cache.py)."""


def _wait_any(pendings: Sequence, timeout_s: float) -> None:
  """Blocks until one of pendings may be ready (a function, the same object on every pending
  of a backend: the driver's _block)."""


OPTIONAL_INSTANCE: dict[str, type | tuple | Callable] = {
    "device_tokens": bool,          # steps take the previous step's tokens on the device: the
                                    # driver may dispatch ahead (overlap), passing `prev`
    "streams_kv": bool,             # prefill takes `streams` (kv.stream_layers; streams.py)
    "overlap_by_default": bool,     # scheduler.overlap=auto turns overlap on (runner)
    "compiles_from_cache": int,     # summary.json (runner)
    "lazy_compiles": int,
    "host_page_weight": (int, float),  # needed once a host tier is attached (prefix_credit)
    "handoff": str,                 # "transfer" or "host" (kv.host_tier_handoff)
    "host_stats": dict,             # host-tier page moves (metrics/kv_cache.py)
    "host": object,                 # a shared host (sim): no fast-forward when not None
    "kill": _kill,
    "restart": _restart,
    "attach_host_tier": _attach_host_tier,
    "kv_bytes": _kv_bytes,
}
OPTIONAL_PENDING: dict[str, type | tuple | Callable] = {
    "end_s": (int, float),          # when it completes on a virtual clock: the driver jumps there
    "build_s": (int, float),        # host seconds building the step (the step record)
    "dispatch_s": (int, float),
    "inner": object,                # a wrapped step (SlowPending): prev is the step it wraps
    "wait_any": _wait_any,
}


# ---- the checker -----------------------------------------------------------------------------


def members(cls: type) -> set[str]:
  """The names an instance of cls has: class attributes, properties and methods (MRO), and
  the attributes its methods assign (`self.x = ...`, read from the source: many are set in
  __init__ only)."""
  names = {n for k in cls.__mro__ if k is not object for n in vars(k)}
  for k in cls.__mro__:
    if k is object:
      continue
    try:
      tree = ast.parse(textwrap.dedent(inspect.getsource(k)))
    except (OSError, TypeError):
      continue
    for node in ast.walk(tree):
      if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
          and isinstance(node.value, ast.Name) and node.value.id == "self":
        names.add(node.attr)
  return names


def _protocol_members(proto: type) -> tuple[list[str], dict[str, Callable]]:
  """([attribute], {method: function}) of proto and the Protocols it extends."""
  attrs, methods = [], {}
  for k in reversed(proto.__mro__):
    if not getattr(k, "_is_protocol", False) or k is Protocol:
      continue
    attrs += [a for a in vars(k).get("__annotations__", {}) if a not in attrs]
    methods.update({n: f for n, f in vars(k).items()
                    if inspect.isfunction(f) and not n.startswith("_")})
  return attrs, methods


def signature_problems(impl: Callable, spec: Callable, *, has_self: bool, name: str,
                       most: int | None = None) -> list[str]:
  """Whether impl accepts the positional calls the driver makes per spec: spec's required
  parameters, then each optional one in turn (up to `most` arguments, when given: the ones the
  driver passes to this implementation), with the same names where impl names them.
  has_self: impl is a function read from a class (its first parameter is the instance)."""
  try:
    have = inspect.signature(impl)
  except (TypeError, ValueError):
    return [f"{name}: no signature to check"]
  if has_self:
    have = have.replace(parameters=list(have.parameters.values())[1:])
  want = [p for p in inspect.signature(spec).parameters.values() if p.name != "self"]
  required = sum(p.default is inspect.Parameter.empty for p in want)
  out = []
  for n in range(required, (len(want) if most is None else most) + 1):
    try:
      have.bind(*range(n))
    except TypeError as e:
      out.append(f"{name}{have}: cannot take the {n} positional arguments "
                 f"({', '.join(p.name for p in want[:n])}) the driver may pass: {e}")
  positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
  got = [p for p in have.parameters.values() if p.kind in positional]
  for w, g in zip(want, got):
    if w.name != g.name:
      out.append(f"{name}{have}: parameter {g.name!r} is {w.name!r} in the contract")
  return out


def transfer_fn_problems(fn: Any) -> list[str]:
  """Whether fn (a function, or a class whose instances are called) is a TransferFn."""
  if isinstance(fn, type):
    return signature_problems(fn.__call__, TransferFn.__call__, has_self=True,
                              name=f"{fn.__name__}.__call__")
  return signature_problems(fn, TransferFn.__call__, has_self=False,
                            name=getattr(fn, "__name__", repr(fn)))


def _value_problems(owner: str, name: str, value: Any, want: Any) -> list[str]:
  """An optional member's value against what OPTIONAL_* says it must be."""
  if isinstance(value, property) or value is None:
    return []        # a property (what it returns is its getter's business) or not set yet
  if isinstance(want, (type, tuple)):
    return [] if isinstance(value, want) else [f"{owner}.{name} = {value!r}: not {want}"]
  if isinstance(value, staticmethod):
    return signature_problems(value.__func__, want, has_self=False, name=f"{owner}.{name}")
  return signature_problems(value, want, has_self=inspect.isfunction(value),
                            name=f"{owner}.{name}")


def problems(cls: type, proto: type, optional: dict | None = None,
             instance: Any = None) -> list[str]:
  """Where cls falls short of proto: a missing required member, a method that does not accept
  the calls the driver makes, an optional member (when present) of the wrong kind. instance:
  a built object of cls (optional): attributes set at run time are read from it, else from
  the class (getattr_static: a method's signature, a class attribute's value)."""
  owner, have, out = cls.__name__, members(cls), []
  attrs, methods = _protocol_members(proto)
  source = instance if instance is not None else cls
  most = None if getattr(source, "device_tokens", False) else 1   # no prev without it
  for name in attrs:
    if name not in have:
      out.append(f"{owner}: no attribute {name!r} ({proto.__name__})")
  for name, spec in methods.items():
    impl = inspect.getattr_static(cls, name, None)
    if impl is None:
      out.append(f"{owner}: no method {name}() ({proto.__name__})")
      continue
    if isinstance(impl, staticmethod):
      impl, has_self = impl.__func__, False
    else:
      has_self = True
    steps = Instance in proto.__mro__ and name in ("prefill", "decode")
    out += signature_problems(impl, spec, has_self=has_self, name=f"{owner}.{name}",
                              most=most if steps else None)
  for name, want in (optional or {}).items():
    if name in have:
      value = (getattr(instance, name, None) if instance is not None
               else inspect.getattr_static(cls, name, None))
      out += _value_problems(owner, name, value, want)
  return out
