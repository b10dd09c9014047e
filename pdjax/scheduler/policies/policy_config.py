"""The scheduler's policy keys checked together, before anything is built: each name resolves
(registry.py), the weighted routers' scorer lists parse and their user scorers load, and each
of scheduler.policy_args reaches at least one of the user's classes."""

from __future__ import annotations

from pdjax.scheduler.policies import CHOICES, registry
from pdjax.scheduler.policies import scorers as scorers_lib

ROUTER_KEYS = ("prefill_router", "decode_router")


def user_classes(s) -> dict:
  """{what: class} of the user's policies and scorers the scheduler config names."""
  out = {}
  for key in registry.KIND_OF_KEY:
    name = s[key]
    if name not in CHOICES[key]:
      out[f"scheduler.{key}={name!r}"] = registry.policy_class(key, name, CHOICES[key])
  for key in ROUTER_KEYS:
    if s[key] == "weighted":
      what = f"scheduler.{key.removesuffix('_router')}_scorers"
      for name, _ in scorers_lib.parse(s.get(what.split(".")[1], "queue=2,prefix=3"), what):
        if name not in scorers_lib.BUILTIN:
          if not registry.is_import_path(name):
            raise registry.PolicyError(
                f"{what}: scorer {name!r} is not one of {sorted(scorers_lib.BUILTIN)} (or a "
                "module:Attr import path)")
          out[f"{what}: {name}"] = registry.load_import_path(what, name, "scorer")
  return out


def check(s) -> None:
  """PolicyError (one line) for the first problem in the scheduler's policy keys."""
  for key in registry.KIND_OF_KEY:
    registry.policy_class(key, s[key], CHOICES[key])
  classes = user_classes(s)
  args = s.get("policy_args", None)
  args = dict(args) if args is not None else {}
  if args and not classes:
    raise registry.PolicyError(
        f"scheduler.policy_args={args!r} is for your own policies, and every policy named is "
        "built-in")
  for arg in args:
    if not any(registry.accepted_keywords(cls) is None or arg in registry.accepted_keywords(cls)
               for cls in classes.values()):
      raise registry.PolicyError(
          f"scheduler.policy_args.{arg} is a keyword none of your policies takes "
          f"({', '.join(sorted(classes))})")
