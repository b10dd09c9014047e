"""`module:Attr` import paths, the one way a config names the researcher's own code (policies,
scorers, workload functions). The module is imported as Python imports it, with the config
file's folder first on sys.path (pdjax/config_path.py); every failure is one line naming the
config key (`what`) and the path."""

from __future__ import annotations

import importlib


def is_import_path(name) -> bool:
  return isinstance(name, str) and ":" in name


def import_attr(what: str, name: str, error: type[Exception] = ValueError):
  """The object at `module:Attr` (Attr may be dotted, e.g. `mod:Outer.Inner`); `error` with a
  one-line message naming `what` when the path is malformed, the module does not import or the
  attribute is missing."""
  module_name, _, attr = name.partition(":") if isinstance(name, str) else ("", "", "")
  if not module_name or not attr:
    raise error(f"{what}={name!r} is not an import path of the form module:Attr")
  try:
    module = importlib.import_module(module_name)
  except ImportError as e:
    raise error(f"{what}={name!r}: cannot import module {module_name!r} ({e})") from None
  except Exception as e:  # pylint: disable=broad-except  (the user's module raised)
    raise error(f"{what}={name!r}: importing {module_name!r} raised "
                f"{type(e).__name__}: {e}") from None
  obj = module
  for part in attr.split("."):
    if not hasattr(obj, part):
      raise error(f"{what}={name!r}: module {module_name!r} has no attribute {attr!r}")
    obj = getattr(obj, part)
  return obj
