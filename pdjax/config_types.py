"""Config value types, checked against the schema (the default config, pdjax/configs/default.py)
before any range check compares them: one line naming the key, never a TypeError traceback.

A locked ConfigDict refuses a value of another type only where it replaces one: a config
file may still write None into any key, True into an integer key, or build its own
ConfigDict with anything in it; `validate` then compared "bogus" >= 1. Pure Python.
"""

from __future__ import annotations

import functools

# Keys that take more than their default's type.
ALSO = {"scheduler.overlap": (bool,)}           # "auto" | true | false
FREE = {"scheduler.policy_args"}                # the user's own keyword arguments: anything


@functools.lru_cache(maxsize=1)
def schema() -> dict:
  """{dotted key: its default value} of every key (sections too) of the default config."""
  import ml_collections
  from pdjax.configs.default import get_config
  out = {}

  def walk(node, prefix: str) -> None:
    for key in node.keys():
      value = node[key]
      out[prefix + key] = value
      if isinstance(value, ml_collections.ConfigDict) and prefix + key not in FREE:
        walk(value, f"{prefix}{key}.")
  walk(get_config(), "")
  return out


def _kind(default) -> tuple[str, object]:
  """(what the message says it must be, check(value) -> bool) for a default value."""
  import ml_collections
  is_int = lambda v: isinstance(v, int) and not isinstance(v, bool)
  is_num = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
  if isinstance(default, ml_collections.ConfigDict):
    return "a section of keys", lambda v: isinstance(v, (ml_collections.ConfigDict, dict))
  if isinstance(default, bool):
    return "true or false", lambda v: isinstance(v, bool)
  if isinstance(default, int):
    return "an integer", is_int
  if isinstance(default, float):
    return "a number", is_num
  if isinstance(default, str):
    return "a string", lambda v: isinstance(v, str)
  if isinstance(default, tuple):
    if default and all(is_int(x) for x in default):
      return "a tuple of integers", lambda v: isinstance(v, (tuple, list)) and all(
          is_int(x) for x in v)
    return "a tuple of numbers", lambda v: isinstance(v, (tuple, list)) and all(
        is_num(x) for x in v)
  return "", lambda v: True


def type_error(cfg) -> str | None:
  """The first key of cfg (in the schema's order) whose value has the wrong type, as
  "kv.page_size=None must be an integer"; None when every one is right. Keys the schema does
  not have, or that cfg lacks, are not checked here."""
  for key, default in schema().items():
    node, found = cfg, True
    for part in key.split("."):
      try:
        node = node[part]
      except (KeyError, TypeError, AttributeError):
        found = False
        break
    if not found:
      continue
    what, ok = _kind(default)
    if ok(node) or isinstance(node, ALSO.get(key, ())):
      continue
    shown = repr(node)
    shown = " ".join((shown if len(shown) <= 100 else shown[:100] + "...").split())
    return f"{key}={shown} must be {what}"
  return None
