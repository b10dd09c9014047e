"""Where a policy named in the config comes from: a built-in name, a name an installed package
registers under the entry-point group `pdjax.policies`, or an import path `module:Attr`.

A config key serves one kind of policy (KIND_OF_KEY); a class serves a kind when it has that
kind's methods (INTERFACES; subclassing policies.base is not required). An installed class says
which kind it serves with its attribute `kind`. `policy_class(key, name)` resolves a name, or
raises PolicyError with the one-line config error; nothing here imports jax.
"""

from __future__ import annotations

import importlib.metadata
import inspect

from pdjax.import_path import import_attr, is_import_path

ENTRY_POINT_GROUP = "pdjax.policies"
KIND_OF_KEY = {"prefill_router": "router", "decode_router": "router", "path": "path",
               "admission": "admission", "colocated_policy": "step",
               "role_switch": "role_switch"}
# kind -> (methods a class of that kind must have, how the error describes them)
INTERFACES = {
    "router": (("choose",), "choose(req, candidates)"),
    "path": (("choose",), "choose(req, prefill_tier, decode_tier, picks=None)"),
    "admission": (("check",), "check(req, worker, path, decode_tier)"),
    "step": (("plan",), "plan(worker, admit)"),
    "role_switch": (("decide",), "decide(now, prefill_tier, decode_tier, transfer_backlog)"),
    "scorer": (("score",), "score(req, worker)"),
}


class PolicyError(ValueError):
  """A policy name that cannot be used for its key: the message is the one-line config error."""


def implements(cls, kind: str) -> bool:
  methods, _ = INTERFACES[kind]
  return inspect.isclass(cls) and all(callable(getattr(cls, m, None)) for m in methods)


def installed(kind: str) -> dict:
  """{name: entry point} of the installed packages' policies (group `pdjax.policies`); which
  kind each serves is known only once it is loaded (its `kind`)."""
  del kind   # entry points carry no kind; `installed_classes` filters after loading
  return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def installed_classes(kind: str) -> dict:
  """{name: class} of the installed policies whose `kind` is `kind` (a name whose module does
  not import is left out here; naming it in a config reports why)."""
  out = {}
  for name, ep in sorted(installed(kind).items()):
    try:
      cls = ep.load()
    except Exception:  # pylint: disable=broad-except  (a broken plugin must not hide the rest)
      continue
    if getattr(cls, "kind", None) == kind and implements(cls, kind):
      out[name] = cls
  return out


def load_import_path(what: str, name: str, kind: str):
  """The class at `module:Attr` (imported as pdjax/import_path.py does: the config file's
  folder first on sys.path); PolicyError naming `what` otherwise, also when it lacks the
  interface of `kind`."""
  obj = import_attr(what, name, PolicyError)
  if not implements(obj, kind):
    module_name, _, attr = name.partition(":")
    _, described = INTERFACES[kind]
    raise PolicyError(f"{what}={name!r}: {module_name}.{attr} lacks {described}, the "
                      f"interface of {what}")
  return obj


def policy_class(key: str, name: str, builtins: dict):
  """The class `scheduler.<key>` names (builtins: that key's table of built-in names,
  policies.CHOICES[key]); PolicyError (one line) when there is none."""
  kind = KIND_OF_KEY[key]
  what = f"scheduler.{key}"
  if not isinstance(name, str):
    raise PolicyError(f"{what}={name!r} is not a policy name or a module:Attr import path")
  if name in builtins:
    return builtins[name]
  if is_import_path(name):
    return load_import_path(what, name, kind)
  entry = installed(kind).get(name)
  if entry is None:
    names = sorted(builtins) + sorted(installed_classes(kind))
    raise PolicyError(f"{what}={name!r} is not one of {names} (or a module:Attr import path)")
  try:
    cls = entry.load()
  except Exception as e:  # pylint: disable=broad-except
    raise PolicyError(f"{what}={name!r}: the installed entry point {entry.value!r} does not "
                      f"load ({type(e).__name__}: {e})") from None
  if getattr(cls, "kind", None) != kind or not implements(cls, kind):
    raise PolicyError(f"{what}={name!r}: the installed {entry.value} serves kind "
                      f"{getattr(cls, 'kind', None)!r}, not {kind!r}")
  return cls


def accepted_keywords(cls) -> set | None:
  """The keyword arguments cls(...) accepts; None when it takes **kwargs (any)."""
  params = inspect.signature(cls).parameters.values()
  if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
    return None
  return {p.name for p in params
          if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}


def construct(cls, params: dict, policy_args: dict, seed: int, what: str):
  """cls(seed=seed, **params, **policy_args), keeping of `params` (the keywords every built-in
  gets) only those a user class accepts; the policy_args it accepts all reach it."""
  accepted = accepted_keywords(cls)
  def takes(k):
    return accepted is None or k in accepted
  kwargs = {k: v for k, v in {**params, "seed": seed}.items() if takes(k)}
  kwargs.update({k: v for k, v in policy_args.items() if takes(k)})
  try:
    return cls(**kwargs)
  except TypeError as e:
    raise PolicyError(f"{what}: {cls.__module__}.{cls.__qualname__}(...) raised "
                      f"TypeError: {e}") from None


def first_doc_line(cls) -> str:
  """The first sentence of the class's docstring (its first paragraph's lines joined), else
  of its module's, without a leading "name: " (the built-ins' module docstrings)."""
  doc = cls.__doc__ if cls.__doc__ and cls.__doc__ is not object.__doc__ else None
  if not doc:
    doc = getattr(inspect.getmodule(cls), "__doc__", None) or ""
  paragraph = " ".join(doc.strip().split("\n\n")[0].split())
  sentence = paragraph.split(". ")[0].rstrip(".")
  head, colon, rest = sentence.partition(": ")
  return rest if colon and " " not in head else sentence
