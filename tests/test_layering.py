"""Imports run down the layers: kernels_pallas imports no pdjax, pdjax.models no pdjax.engine,
and the host-logic packages no jax. Read from the source (ast), so lazy imports inside
functions count too, and followed through the repo's own modules (an arrow two hops up is
still an arrow up)."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
HOST_LOGIC = ["pdjax/scheduler", "pdjax/kv", "pdjax/request.py", "pdjax/metrics",
              "pdjax/workload", "pdjax/faults", "pdjax/text",
              "pdjax/server/protocol.py", "pdjax/server/text_stream.py",
              "pdjax/server/prometheus.py"]


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _source(module: str) -> pathlib.Path | None:
  """The repo file of a module, or None when it is not ours (jax, numpy, ...)."""
  base = ROOT.joinpath(*module.split("."))
  for path in (base.with_suffix(".py"), base / "__init__.py"):
    if path.is_file():
      return path
  return None


def _imports(path: pathlib.Path) -> set[str]:
  """Every module an import statement in the file names, relative imports resolved;
  `from a import b` yields both a and a.b (b may be a submodule)."""
  package = _module_name(path).split(".")
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


def _closure(paths) -> dict[str, str]:
  """Every module reachable from the files through repo imports -> the file that named it."""
  seen, found, todo = set(), {}, list(paths)
  while todo:
    path = todo.pop()
    if path in seen:
      continue
    seen.add(path)
    for module in _imports(path):
      found.setdefault(module, str(path.relative_to(ROOT)))
      parts = module.split(".")
      for i in range(1, len(parts) + 1):   # importing a.b.c runs a and a.b too
        source = _source(".".join(parts[:i]))
        if source is not None:
          todo.append(source)
  return found


def _files(*roots: str) -> list[pathlib.Path]:
  paths = [ROOT / r for r in roots]
  return sorted(f for p in paths for f in ([p] if p.is_file() else p.rglob("*.py")))


def _offenders(found: dict[str, str], banned: str) -> list[str]:
  return sorted(f"{by} -> {m}" for m, by in found.items()
                if m == banned or m.startswith(banned + "."))


def test_kernels_import_no_pdjax():
  assert _offenders(_closure(_files("kernels_pallas")), "pdjax") == []


def test_models_import_no_engine():
  assert _offenders(_closure(_files("pdjax/models")), "pdjax.engine") == []


@pytest.mark.parametrize("banned", ["jax", "jaxlib", "flax"])
def test_host_logic_imports_no_jax(banned):
  assert _offenders(_closure(_files(*HOST_LOGIC)), banned) == []


def test_the_checker_sees_an_arrow_up():
  """The engine does import the models and jax: the walk must find both."""
  found = _closure(_files("pdjax/engine/cluster.py"))
  assert _offenders(found, "pdjax.models") and _offenders(found, "jax")
