"""Every entry point's -h / --help / --helpfull prints its docstring (usage) and exits 0."""

import ast
import shutil
import subprocess
import sys

import pytest

from helpers.paths import ROOT

ENTRY_POINTS = ["pdjax.run", "pdjax.plan", "pdjax.sweep", "pdjax.serve", "pdjax.calibrate",
                "pdjax.bench_serve", "pdjax.generate", "pdjax.convert", "pdjax.from_gguf",
                "pdjax.lower_check", "pdjax.policies"]


def _first_doc_line(module: str) -> str:
  path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
  return ast.get_docstring(ast.parse(path.read_text())).splitlines()[0]


def test_every_app_run_module_is_listed():
  """A new absl entry point joins ENTRY_POINTS (and so this test)."""
  found = {".".join(p.relative_to(ROOT).with_suffix("").parts)
           for p in (ROOT / "pdjax").rglob("*.py") if "app.run(" in p.read_text()}
  assert found <= set(ENTRY_POINTS)


@pytest.mark.parametrize("flag", ["--help", "-h", "--helpfull"])
@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_help_exits_0_with_the_docstring(module, flag):
  proc = subprocess.run([sys.executable, "-m", module, flag], cwd=ROOT, capture_output=True,
                        text=True, timeout=300)
  assert (proc.returncode, proc.stderr) == (0, "")
  assert _first_doc_line(module) in proc.stdout


def test_console_script_help_shows_the_run_docstring():
  script = shutil.which("pdjax")
  if script is None:
    pytest.skip("the pdjax console script is not installed")
  proc = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0
  assert _first_doc_line("pdjax.run") in proc.stdout
  assert "--workdir" in proc.stdout   # pdjax.run's own flags, though __main__ is the script
