"""The policy interfaces the driver calls. Pure Python: the simulator reuses them verbatim.

Policies see instances and requests only through the read-only views of the policy API
(pdjax/scheduler/policy_api.py: `InstanceView`, `RequestView`), built-in and user policies alike;
subclassing these bases is not required (a class with the methods is enough: registry.py).
"""

from __future__ import annotations

import dataclasses

from pdjax.request import Request


class Router:
  """Picks one of the eligible workers of a tier for a request."""

  def choose(self, req: Request, candidates: list):  # -> InstanceQueue
    raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class PathChoice:
  path: str          # "disaggregated" | "colocated"
  tier: str          # the tier whose instance serves it first: "prefill" | "decode" | "colocated"
  reason: dict | None = dataclasses.field(default=None, compare=False)
                     # why (Request.path_reason: the policy adds what it weighed; None: the
                     # driver records the policy's name and the choice)


class PathPolicy:
  """Disaggregated mode only: which path a request takes.

  A policy with `uses_picks` decides for the instances the routers would use: the driver first
  asks the prefill and decode routers for their picks and passes them (`picks`: (prefill
  worker or None, decode worker or None)); the request then goes to the pick of the chosen
  tier."""

  uses_picks = False

  def choose(self, req: Request, prefill_tier: list, decode_tier: list,
             picks: tuple | None = None) -> PathChoice:
    raise NotImplementedError

  def observe_first_token(self, req: Request) -> None:
    """req's first token arrived (its TTFT is measured): a policy that learns from what it
    predicted reads it here."""


class AdmissionPolicy:
  """Accepts a routed request (None) or rejects it with a one-line reason."""

  def check(self, req: Request, worker, path: PathChoice, decode_tier: list) -> str | None:
    return None


@dataclasses.dataclass
class StepPlan:
  """One engine step: prefill chunks (request, start, end) and/or decode rows (requests).
  A step with chunks runs the ragged (prefill) program, decode rows riding along as q_len = 1
  rows; a step with decode rows only runs the decode program."""
  chunks: list = dataclasses.field(default_factory=list)
  decodes: list = dataclasses.field(default_factory=list)

  @property
  def empty(self) -> bool:
    return not self.chunks and not self.decodes

  @property
  def num_tokens(self) -> int:
    return sum(end - start for _, start, end in self.chunks) + len(self.decodes)


class StepPolicy:
  """What an idle worker runs next, given its waiting queue and running batch."""

  # True where, with nothing waiting, plan()'s decode rows are a function of worker.running
  # alone (the same rows in the same order while it does not change): the simulator may then
  # compute many steps at once (scheduler/decode_segments.py).
  decodes_follow_running = False

  def plan(self, worker, admit) -> StepPlan:
    """`admit(req)` allocates a waiting request's prompt pages and, when it will decode on
    this worker, reserves its decode slot (counted by `num_running()`); False means no room.
    A request is admitted once (`worker.admitted(req)` afterwards)."""
    raise NotImplementedError


class RoleSwitchPolicy:
  """May move drained workers between the prefill and decode tiers (disaggregated mode)."""

  def decide(self, now: float, prefill_tier: list, decode_tier: list,
             transfer_backlog: int) -> list[tuple]:
    """Returns (worker, new_role) pairs; only drained workers are switched."""
    return []

  def remesh(self, now: float, prefill_tier: list, decode_tier: list,
             transfer_backlog: int):
    """A tier's new layout to switch to now (policies/remesh.py's RemeshPlan), or None."""
    return None
