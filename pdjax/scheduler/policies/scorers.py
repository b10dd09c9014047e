"""Scorers the `weighted` router adds up (scheduler.prefill_scorers / decode_scorers, e.g.
"queue=2,prefix=3", llm-d's default profile's weights).

A scorer rates each candidate instance for a request; `raw(req, worker)` is its measure and
`higher_is_better` its direction. The router normalises each scorer's measures over the
candidates of one decision to [0, 1] (1: the best candidate, 0: the worst; all equal: 0 for
every candidate) before weighting, so weights compare scorers of different units. A user
scorer is a class with `score(req, worker) -> float` (higher is better), named by import path
in the same list ("queue=1,my_mod:LongestWait=2"); it may define `chosen(req, worker)` to
learn which instance the router picked.
"""

from __future__ import annotations

from pdjax.kv.prefix_cache import prefix_names, salt_for


class Scorer:
  higher_is_better = True

  def raw(self, req, worker) -> float:
    raise NotImplementedError

  def chosen(self, req, worker) -> None:
    """The router sent req to worker."""


class Queue(Scorer):
  """queue: prompt tokens waiting on the instance (fewer is better)."""
  higher_is_better = False

  def raw(self, req, worker):
    return worker.queued_tokens()


class Running(Scorer):
  """running: decode slots taken, running sequences and reservations (fewer is better)."""
  higher_is_better = False

  def raw(self, req, worker):
    return worker.num_running()


class KvFree(Scorer):
  """kv_free: free KV pages (more is better)."""

  def raw(self, req, worker):
    return worker.free_pages()


class Prefix(Scorer):
  """prefix: prompt tokens the instance's prefix cache and its node's host tier would save."""

  def __init__(self, shared_salt: str = ""):
    self.shared_salt = shared_salt
    self._names = (None, None)   # (request id, its page names and salt): once per request

  def raw(self, req, worker):
    page_size = worker.page_size
    if self._names[0] is not req:
      salt = salt_for(req.tenant, self.shared_salt, req.cache_salt)
      self._names = (req, (prefix_names(salt, req.prefill_tokens, page_size), salt))
    names, salt = self._names[1]
    return worker.prefix_credit(names, salt) * page_size


class Session(Scorer):
  """session: 1 for the instance that served the request's session last, else 0."""

  def __init__(self):
    self._last: dict[str, str] = {}

  def raw(self, req, worker):
    return float(bool(req.session) and self._last.get(req.session) == worker.name)

  def chosen(self, req, worker):
    if req.session:
      self._last[req.session] = worker.name


class Transfer(Scorer):
  """transfer: KV pages on their way to the instance (fewer is better)."""
  higher_is_better = False

  def raw(self, req, worker):
    return worker.kv_inbound_pages()


class UserScorer(Scorer):
  """A user's class with score(req, worker) (higher is better)."""

  def __init__(self, inner):
    self.inner = inner

  def raw(self, req, worker):
    return float(self.inner.score(req, worker))

  def chosen(self, req, worker):
    hook = getattr(self.inner, "chosen", None)
    if hook is not None:
      hook(req, worker)


BUILTIN = {"queue": Queue, "running": Running, "kv_free": KvFree, "prefix": Prefix,
           "session": Session, "transfer": Transfer}


def parse(spec: str, what: str) -> list[tuple[str, float]]:
  """"queue=2,prefix=3" -> [("queue", 2.0), ("prefix", 3.0)]; ValueError (one line) when an
  entry is not name=weight with a finite weight > 0 or a name repeats."""
  if not isinstance(spec, str) or not spec.strip():
    raise ValueError(f"{what}={spec!r} must list scorer=weight entries, e.g. 'queue=2,prefix=3'")
  out, seen = [], set()
  for entry in spec.split(","):
    name, eq, weight = entry.strip().rpartition("=")
    try:
      w = float(weight)
    except ValueError:
      w = float("nan")
    if not eq or not name or not (w > 0 and w != float("inf")):
      raise ValueError(f"{what}={spec!r}: {entry.strip()!r} is not scorer=weight with a weight "
                       "> 0")
    if name in seen:
      raise ValueError(f"{what}={spec!r}: scorer {name!r} is listed twice")
    seen.add(name)
    out.append((name, w))
  return out


def make(name: str, what: str, shared_salt: str = "", seed: int = 0,
         policy_args: dict | None = None) -> Scorer:
  """The scorer `name` (built-in or module:Attr); ValueError (one line) otherwise."""
  from pdjax.scheduler.policies import registry
  if name in BUILTIN:
    return Prefix(shared_salt) if name == "prefix" else BUILTIN[name]()
  if not registry.is_import_path(name):
    raise ValueError(f"{what}: scorer {name!r} is not one of {sorted(BUILTIN)} (or a "
                     "module:Attr import path)")
  cls = registry.load_import_path(what, name, "scorer")
  return UserScorer(registry.construct(cls, {}, policy_args or {}, seed, f"{what}: {name}"))
