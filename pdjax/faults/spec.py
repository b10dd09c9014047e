"""The `faults.*` config as a frozen spec, parsed and validated with one-line errors (pure
Python). Everything is off by default.

  transfer_fail_prob  each KV transfer attempt fails with this probability
  transfer_delay      extra seconds per transfer attempt: "" | "const:S" | "exp:MEAN" |
                      "uniform:LO:HI" (an attempt delayed past kv.transfer_timeout_s fails)
  slow_instance       "name:factor@t,...": that instance's steps take factor x longer from t
  kill_instance       "name@t,...": that instance dies at t (its device state is gone)
  restart_s           a killed instance comes back (empty) this many seconds later; 0 = never
  cancel_prob         a client aborts the request with this probability, at a stage drawn
                      uniformly from cancel_stages
  cancel_stages       comma list of queued | prefill | transfer_wait | transfer | decode
  tamper_prob         a sealed KV transfer between nodes (kv.seal_cross_node) has one byte
                      of a piece flipped in transit with this probability (refused there)
  seed                -1: the run's seed
"""

from __future__ import annotations

import dataclasses
import math

CANCEL_STAGES = ("queued", "prefill", "transfer_wait", "transfer", "decode")
DELAY_KINDS = ("const", "exp", "uniform")


class FaultSpecError(ValueError):
  """A bad faults.* value; str() is the one line shown to the user."""


@dataclasses.dataclass(frozen=True)
class FaultSpec:
  transfer_fail_prob: float = 0.0
  transfer_delay: tuple = ()                          # (kind, *params) or ()
  slow_instances: tuple[tuple[str, float, float], ...] = ()   # (name, factor, from_s)
  kills: tuple[tuple[str, float], ...] = ()           # (name, at_s)
  restart_s: float = 0.0
  cancel_prob: float = 0.0
  cancel_stages: tuple[str, ...] = CANCEL_STAGES
  seed: int = 0
  tamper_prob: float = 0.0

  @property
  def any(self) -> bool:
    return bool(self.transfer_fail_prob or self.transfer_delay or self.slow_instances
                or self.kills or self.cancel_prob or self.tamper_prob)


def _fail(key: str, value, why: str):
  raise FaultSpecError(f"faults.{key}={value!r} {why}")


def _number(key: str, text: str, value, lo: float = 0.0) -> float:
  try:
    x = float(text)
  except ValueError:
    x = math.nan
  if not (math.isfinite(x) and x >= lo):
    _fail(key, value, f"has {text!r} where a finite number >= {lo:g} is needed")
  return x


def _items(value) -> list[str]:
  return [x.strip() for x in str(value or "").split(",") if x.strip()]


def parse_delay(value) -> tuple:
  text = str(value or "").strip()
  if not text:
    return ()
  kind, _, rest = text.partition(":")
  params = rest.split(":") if rest else []
  want = {"const": 1, "exp": 1, "uniform": 2}.get(kind)
  if want is None or len(params) != want:
    _fail("transfer_delay", value, "is not one of const:S, exp:MEAN, uniform:LO:HI")
  nums = tuple(_number("transfer_delay", p, value) for p in params)
  if kind == "uniform" and nums[0] > nums[1]:
    _fail("transfer_delay", value, "has LO > HI")
  return (kind, *nums)


def parse_faults(f, run_seed: int) -> FaultSpec:
  """f: the faults ConfigDict (or a dict); raises FaultSpecError naming the key."""
  get = f.get
  prob = {}
  for key in ("transfer_fail_prob", "cancel_prob", "tamper_prob"):
    p = get(key, 0.0)
    if not (isinstance(p, (int, float)) and 0.0 <= p <= 1.0):
      _fail(key, p, "must be a probability in [0, 1]")
    prob[key] = float(p)
  slow = []
  for item in _items(get("slow_instance", "")):
    name, _, rest = item.partition(":")
    factor, at, t = rest.partition("@")
    if not (name and at):
      _fail("slow_instance", get("slow_instance"), f"item {item!r} is not name:factor@seconds")
    slow.append((name, _number("slow_instance", factor, get("slow_instance"), lo=1.0),
                 _number("slow_instance", t, get("slow_instance"))))
  kills = []
  for item in _items(get("kill_instance", "")):
    name, at, t = item.rpartition("@")
    if not (name and at):
      _fail("kill_instance", get("kill_instance"), f"item {item!r} is not name@seconds")
    kills.append((name, _number("kill_instance", t, get("kill_instance"))))
  restart = get("restart_s", 0.0)
  if not (isinstance(restart, (int, float)) and math.isfinite(restart) and restart >= 0):
    _fail("restart_s", restart, "must be >= 0 seconds (0: never)")
  stages = tuple(_items(get("cancel_stages", ",".join(CANCEL_STAGES))))
  bad = [s for s in stages if s not in CANCEL_STAGES]
  if bad or not stages:
    _fail("cancel_stages", get("cancel_stages"), f"must list some of {', '.join(CANCEL_STAGES)}")
  seed = get("seed", -1)
  return FaultSpec(transfer_fail_prob=prob["transfer_fail_prob"],
                   transfer_delay=parse_delay(get("transfer_delay", "")),
                   slow_instances=tuple(slow), kills=tuple(sorted(kills, key=lambda k: k[1])),
                   restart_s=float(restart), cancel_prob=prob["cancel_prob"],
                   cancel_stages=stages, seed=run_seed if seed < 0 else int(seed),
                   tamper_prob=prob["tamper_prob"])


def check_instance_names(spec: FaultSpec, names: list[str]) -> None:
  """Every instance a fault names must exist in the run."""
  for key, named in (("slow_instance", [s[0] for s in spec.slow_instances]),
                     ("kill_instance", [k[0] for k in spec.kills])):
    for name in named:
      if name not in names:
        _fail(key, name, f"is not an instance of this run ({', '.join(names)})")
