"""Which modules a repo file imports, read from the source (ast): module-level and lazy
imports alike, relative ones resolved, followed through the repo's own modules. The layering
tests (tests/commands/test_layering.py) and the text package's no-jax test use it."""

import ast
import pathlib

from helpers.paths import ROOT


def module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_file(module: str) -> pathlib.Path | None:
  """The repo file of a module, or None when it is not ours (jax, numpy, ...)."""
  base = ROOT.joinpath(*module.split("."))
  for path in (base.with_suffix(".py"), base / "__init__.py"):
    if path.is_file():
      return path
  return None


def imports(path: pathlib.Path) -> set[str]:
  """Every module an import statement in the file names, relative imports resolved;
  `from a import b` yields both a and a.b (b may be a submodule)."""
  package = module_name(path).split(".")
  if path.name != "__init__.py":
    package = package[:-1]
  out = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      out.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = package[:len(package) - node.level + 1] if node.level else []
      module = ".".join(base + ([node.module] if node.module else []))
      out.add(module)
      out.update(f"{module}.{alias.name}" for alias in node.names)
  return out


def closure(paths) -> dict[str, str]:
  """Every module reachable from the files through repo imports -> the file that named it."""
  seen, found, todo = set(), {}, list(paths)
  while todo:
    path = todo.pop()
    if path in seen:
      continue
    seen.add(path)
    for module in imports(path):
      found.setdefault(module, str(path.relative_to(ROOT)))
      parts = module.split(".")
      for i in range(1, len(parts) + 1):   # importing a.b.c runs a and a.b too
        source = source_file(".".join(parts[:i]))
        if source is not None:
          todo.append(source)
  return found


def files(*roots: str) -> list[pathlib.Path]:
  paths = [ROOT / r for r in roots]
  return sorted(f for p in paths for f in ([p] if p.is_file() else p.rglob("*.py")))


def offenders(found: dict[str, str], banned: str) -> list[str]:
  return sorted(f"{by} -> {m}" for m, by in found.items()
                if m == banned or m.startswith(banned + "."))
