"""What `python -m pdjax.policies` prints: every name each scheduler key takes, built-in and
installed (entry-point group `pdjax.policies`), with the first line of its docstring, and the
weighted router's scorers."""

from __future__ import annotations

from pdjax.scheduler import policies
from pdjax.scheduler.policies import registry
from pdjax.scheduler.policies import scorers

KEYS_OF_KIND = {}
for _key, _kind in registry.KIND_OF_KEY.items():
  KEYS_OF_KIND.setdefault(_kind, []).append(_key)


def rows(kind: str) -> list[tuple[str, str, str]]:
  """(name, origin, first doc line) of each name a key of `kind` takes."""
  key = KEYS_OF_KIND[kind][0]
  out = [(name, "built-in", registry.first_doc_line(cls))
         for name, cls in sorted(policies.CHOICES[key].items())]
  out += [(name, f"{cls.__module__}:{cls.__qualname__}", registry.first_doc_line(cls))
          for name, cls in registry.installed_classes(kind).items()]
  return out


def listing() -> str:
  lines = []
  for kind, keys in KEYS_OF_KIND.items():
    lines.append(", ".join(f"scheduler.{k}" for k in keys) + ":")
    table = rows(kind)
    width = max(len(name) for name, _, _ in table)
    for name, origin, doc in table:
      lines.append(f"  {name:<{width}}  {'' if origin == 'built-in' else f'[{origin}] '}{doc}")
  lines.append("scheduler.prefill_scorers, scheduler.decode_scorers (router weighted, "
               "\"name=weight,...\"):")
  width = max(map(len, scorers.BUILTIN))
  for name, cls in sorted(scorers.BUILTIN.items()):
    lines.append(f"  {name:<{width}}  {registry.first_doc_line(cls)}")
  lines.append("Each key also takes module:Attr, a class of your own (the config file's folder "
               "is first on sys.path); docs/policies.md.")
  return "\n".join(lines)
