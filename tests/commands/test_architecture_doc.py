"""docs/architecture.md opens with "Where things live": every package, every command, every
experiment and every benchmark is named there, so a newcomer finds any part's file from its
first screen (issue 26). A package, command, experiment or benchmark added later must be named
too, or this fails naming it."""

import pathlib
import tomllib

ROOT = next(p for p in pathlib.Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())


def _commands() -> list[str]:
  """The modules of [project.scripts]: pdjax.run:entry_point -> pdjax/run.py."""
  scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
  return sorted({v.split(":")[0].replace(".", "/") + ".py" for v in scripts.values()})


def _where_things_live() -> str:
  text = (ROOT / "docs" / "architecture.md").read_text()
  start = text.index("## Where things live")
  return text[start:text.index("\n## ", start + 1)]


def _named() -> list[str]:
  """Every pdjax package, kernels_pallas (its subpackages are the kernels' own business),
  every command module, experiment folder and benchmark script."""
  paths = sorted(str(init.parent.relative_to(ROOT))
                 for init in (ROOT / "pdjax").rglob("__init__.py"))
  paths += ["kernels_pallas"] + _commands()
  paths += [str(p.relative_to(ROOT)) for p in sorted((ROOT / "experiments").iterdir())
            if p.is_dir()]
  paths += [str(p.relative_to(ROOT)) for p in sorted((ROOT / "benchmarks").glob("*.py"))]
  return paths


def test_every_package_command_experiment_and_benchmark_is_named():
  section = _where_things_live()
  missing = [p for p in _named() if f"`{p}" not in section]
  assert missing == [], f"not named in docs/architecture.md's Where things live: {missing}"
