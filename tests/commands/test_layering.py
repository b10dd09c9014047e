"""Imports run down the layers: kernels_pallas imports no pdjax, pdjax.models no pdjax.engine,
and the host-logic packages no jax. Read from the source (ast), so lazy imports inside
functions count too, and followed through the repo's own modules (an arrow two hops up is
still an arrow up)."""

import ast
import pathlib

import pytest

from helpers.import_walk import (closure as _closure, files as _files, imports as _imports,
                                 module_name as _module_name, offenders as _offenders,
                                 source_file as _source)
from helpers.paths import ROOT

HOST_LOGIC = ["pdjax/scheduler", "pdjax/kv", "pdjax/request.py", "pdjax/metrics",
              "pdjax/workload", "pdjax/faults", "pdjax/text",
              "pdjax/server/protocol.py", "pdjax/server/text_stream.py",
              "pdjax/server/prometheus.py"]


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


# The command modules: flag parsing and main() / entry_point() only. Nothing else imports them
# (the libraries they run live in the packages: pdjax.runner, pdjax.planning, ...).
COMMANDS = ["pdjax.run", "pdjax.sweep", "pdjax.plan", "pdjax.serve", "pdjax.bench_serve",
            "pdjax.generate", "pdjax.calibrate", "pdjax.convert", "pdjax.from_gguf",
            "pdjax.lower_check", "pdjax.policies"]


def _library_files() -> list[pathlib.Path]:
  """Every pdjax module that is not a command: each package's modules and the top-level
  libraries (request.py, config.py, cli.py, config_reference.py, ...)."""
  return [f for f in _files("pdjax") if _module_name(f) not in COMMANDS]


def test_the_commands_exist():
  for module in COMMANDS:
    assert _source(module) is not None, module


def test_no_library_imports_a_command():
  """No package module (nor top-level library) imports a command module, lazily or not."""
  offenders = sorted(f"{f.relative_to(ROOT)} -> {m}" for f in _library_files()
                     for m in _imports(f)
                     if any(m == c or m.startswith(c + ".") for c in COMMANDS))
  assert offenders == []


def test_the_library_list_holds_the_top_level_libraries():
  names = {_module_name(f) for f in _library_files()}
  assert {"pdjax.request", "pdjax.config", "pdjax.cli", "pdjax.config_reference",
          "pdjax.runner.execute", "pdjax.planning.placement_runs"} <= names
  assert not names & set(COMMANDS)


def test_every_command_is_a_script():
  """Each command has entry_point() and a [project.scripts] entry."""
  tomllib = pytest.importorskip("tomllib")   # Python 3.11+
  scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
  targets = set(scripts.values())
  for module in sorted(COMMANDS):
    tree = ast.parse(_source(module).read_text())
    assert "entry_point" in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, module
    assert f"{module}:entry_point" in targets, module


def _import_edges(path: pathlib.Path) -> set[str]:
  """The repo modules the file's import statements run, lazy ones included: per statement the
  module it names (`from a import b`: a.b when b is a module, else a), not the packages above
  it (a package's __init__ runs first on any path, so it closes no cycle)."""
  package = _module_name(path).split(".")
  if path.name != "__init__.py":
    package = package[:-1]
  out = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = package[:len(package) - node.level + 1] if node.level else []
      module = ".".join(base + ([node.module] if node.module else []))
      names = [f"{module}.{alias.name}" if _source(f"{module}.{alias.name}") else module
               for alias in node.names]
    else:
      continue
    for name in names:
      parts = name.split(".")
      for i in range(len(parts), 0, -1):   # the longest prefix that is one of ours
        if _source(".".join(parts[:i])) is not None:
          out.add(".".join(parts[:i]))
          break
  return out


def _import_graph() -> dict[str, set[str]]:
  return {_module_name(f): _import_edges(f) - {_module_name(f)} for f in _files("pdjax")}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """One cycle (a -> b -> ... -> a) per strongly connected component of more than one module
  (Tarjan), each starting at its smallest module and following the shortest way back."""
  index, low, stack, on_stack, comps = {}, {}, [], set(), []

  def connect(v):   # recursion depth is bounded by the module count (~250)
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in graph.get(v, ()):
      if w not in index:
        connect(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = set()
      while True:
        w = stack.pop()
        on_stack.discard(w)
        comp.add(w)
        if w == v:
          break
      if len(comp) > 1:
        comps.append(comp)

  for v in sorted(graph):
    if v not in index:
      connect(v)
  cycles = []
  for comp in comps:
    start = min(comp)
    paths, frontier = {start: [start]}, [start]
    while frontier:   # breadth first within the component, back to start
      nxt = []
      for v in frontier:
        for w in sorted(graph[v] & comp):
          if w == start and len(paths[v]) > 1:
            nxt = []
            cycles.append(paths[v] + [start])
            break
          if w not in paths:
            paths[w] = paths[v] + [w]
            nxt.append(w)
        else:
          continue
        break
      frontier = nxt
  return sorted(cycles)


def test_the_import_graph_has_no_cycle():
  """No two pdjax modules import each other, directly or through others (module-level and
  lazy imports alike). Prints every cycle found."""
  cycles = _cycles(_import_graph())
  for cycle in cycles:
    print("import cycle: " + " -> ".join(cycle))
  assert [" -> ".join(c) for c in cycles] == []


def test_the_cycle_check_sees_a_cycle():
  graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
  assert _cycles(graph) == [["a", "b", "c", "a"]]


# ---- issue 47, item 13: the house's small moves, each guarded ------------------------------

@pytest.mark.parametrize("package,banned", [
    ("pdjax/sim", "pdjax.engine"),        # the simulator stands without the engine
    ("pdjax/engine", "pdjax.runner"),     # the engine does not reach up into the runner
    ("pdjax/kv", "pdjax.scheduler"),      # the KV layer sits below the scheduler (DeviceError
                                          # lives in pdjax/errors.py, below both)
], ids=["sim-no-engine", "engine-no-runner", "kv-no-scheduler"])
def test_a_layer_does_not_reach_up(package, banned):
  assert _offenders(_closure(_files(package)), banned) == []


def test_the_old_from_gguf_path_is_gone():
  """python -m pdjax.from_gguf (script pdjax-from-gguf) is the one path; no shim, no doc
  naming the old one."""
  assert _source("pdjax.text.from_gguf") is None
  texts = [ROOT / "README.md", *ROOT.joinpath("docs").glob("*.md"),
           *ROOT.joinpath("pdjax").rglob("*.py")]
  assert [str(p.relative_to(ROOT)) for p in texts
          if "pdjax.text.from_gguf" in p.read_text()] == []


def test_config_reference_is_a_library():
  """The command is `python -m pdjax.config --markdown`; config_reference has no main block."""
  tree = ast.parse((ROOT / "pdjax" / "config_reference.py").read_text())
  mains = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
  assert mains == []


def test_every_kernel_package_says_what_it_holds():
  missing = [str(p.relative_to(ROOT)) for p in ROOT.joinpath("kernels_pallas").rglob(
      "__init__.py") if not ast.get_docstring(ast.parse(p.read_text()))]
  assert missing == []


def test_the_driver_stays_under_400_lines():
  lines = len((ROOT / "pdjax" / "scheduler" / "driver.py").read_text().splitlines())
  assert lines < 400, f"pdjax/scheduler/driver.py has {lines} lines"
