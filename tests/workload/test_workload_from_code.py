"""workload.kind = "python" (issue 46): a function in the researcher's own file, named
`module:function`, gives the rows; they arrive as written, bad rows are problem lines naming the
row, and a path that cannot be used is a one-line config error."""

import json
import subprocess
import sys
import textwrap

import pytest

from pdjax.workload import loader

VOCAB, EOS = 128, (2,)
STUDY = textwrap.dedent('''
    import numpy as np

    def rows(config, rng):
      """Three sessions of two turns, 0.25 s apart, lengths from the rng."""
      for i in range(config.num_requests):
        yield {"arrival_s": 0.25 * i, "prompt_len": int(rng.integers(8, 64)),
               "output_len": np.int64(4 + i), "session": f"s{i % 3}", "tenant": "lab",
               "id": f"mine-{i}"}

    def given_ids(config, rng):
      return [{"arrival_s": 0.0, "prompt_ids": np.arange(5, 12), "output_len": 3},
              {"arrival_s": 1.5, "prompt_ids": (7, 8, 9), "output_len": 2}]

    def some_bad(config, rng):
      return [{"arrival_s": 0.0, "prompt_len": 10, "output_len": 3},
              {"arrival_s": -1.0, "prompt_len": 10, "output_len": 3},
              "not a row",
              {"arrival_s": 2.0, "output_len": 3},
              {"arrival_s": 3.0, "prompt_len": 10, "output_len": 3}]

    def not_rows(config, rng):
      return 7

    def one_arg(config):
      return []

    NOT_A_FUNCTION = 3
    ''')


@pytest.fixture
def study(tmp_path, monkeypatch):
  (tmp_path / "my_workloads.py").write_text(STUDY)
  monkeypatch.syspath_prepend(str(tmp_path))
  yield tmp_path
  sys.modules.pop("my_workloads", None)


def load(path, **overrides):
  w = loader.default_workload_config()
  w.update(kind="python", path=path, **overrides)
  return loader.load_workload(w, seed=0, vocab_size=VOCAB, eos_ids=EOS, max_model_len=512)


def test_rows_arrive_as_written(study):
  requests, problems = load("my_workloads:rows", num_requests=6)
  assert problems == []
  import numpy as np
  rng = np.random.default_rng(0)          # what the function gets for seed 0
  lengths = [int(rng.integers(8, 64)) for _ in range(6)]
  assert [r.id for r in requests] == [f"mine-{i}" for i in range(6)]
  assert [r.arrival_s for r in requests] == [0.25 * i for i in range(6)]
  assert [len(r.prompt_ids) for r in requests] == lengths
  assert [r.sampling.max_new_tokens for r in requests] == [4, 5, 6, 7, 8, 9]
  assert [r.session for r in requests] == ["s0", "s1", "s2", "s0", "s1", "s2"]
  assert {r.tenant for r in requests} == {"lab"}
  again, _ = load("my_workloads:rows", num_requests=6)
  assert [r.prompt_ids for r in again] == [r.prompt_ids for r in requests]


def test_given_token_ids_and_numpy_values_are_kept(study):
  requests, problems = load("my_workloads:given_ids")
  assert problems == []
  assert [list(r.prompt_ids) for r in requests] == [[5, 6, 7, 8, 9, 10, 11], [7, 8, 9]]
  assert [r.arrival_s for r in requests] == [0.0, 1.5]
  assert [r.id for r in requests] == ["req-00000", "req-00001"]


def test_bad_rows_are_problem_lines_naming_the_row(study):
  requests, problems = load("my_workloads:some_bad")
  assert [r.arrival_s for r in requests] == [0.0, 3.0]
  assert problems == [
      "my_workloads:some_bad row 2: arrival_s=-1.0 must be >= 0",
      "my_workloads:some_bad row 3: expected a dict of trace-row fields, got str",
      "my_workloads:some_bad row 4: missing key 'prompt_ids' or 'prompt_len'"]


@pytest.mark.parametrize("path,message", [
    ("my_workloads", "workload.path='my_workloads' is not an import path of the form "
     "module:Attr"),
    ("no_such_study:rows", "workload.path='no_such_study:rows': cannot import module "
     "'no_such_study' (No module named 'no_such_study')"),
    ("my_workloads:nope", "workload.path='my_workloads:nope': module 'my_workloads' has no "
     "attribute 'nope'"),
    ("my_workloads:NOT_A_FUNCTION", "workload.path='my_workloads:NOT_A_FUNCTION' is a int, "
     "not a function"),
    ("my_workloads:one_arg", "workload.path='my_workloads:one_arg': one_arg must take "
     "(config, rng)"),
], ids=["form", "module", "attribute", "not_callable", "signature"])
def test_a_path_that_cannot_be_used_is_one_line(study, path, message):
  w = loader.default_workload_config()
  w.update(kind="python", path=path)
  assert loader.validate_workload(w) == message


def test_a_function_that_returns_no_rows_is_one_line(study):
  with pytest.raises(ValueError) as e:
    load("my_workloads:not_rows")
  assert str(e.value) == "workload.path='my_workloads:not_rows' returned int, not an iterable of rows"


def test_the_simulator_runs_a_workload_from_the_config_folder(tmp_path):
  """The config file's folder is on sys.path: my_study/config.py names my_workloads:rows."""
  folder = tmp_path / "my_study"
  folder.mkdir()
  (folder / "my_workloads.py").write_text(STUDY)
  (folder / "config.py").write_text(textwrap.dedent('''
      from pdjax.configs import default

      def get_config():
        cfg = default.get_config("smoke")
        cfg.backend = "sim"
        cfg.mode = "disaggregated"
        cfg.workload.kind = "python"
        cfg.workload.path = "my_workloads:rows"
        cfg.workload.num_requests = 5
        return cfg
      '''))
  workdir = tmp_path / "out"
  proc = subprocess.run([sys.executable, "-m", "pdjax.run", f"--config={folder / 'config.py'}",
                         f"--workdir={workdir}", "--config.progress=False"],
                        capture_output=True, text=True, timeout=300, cwd=tmp_path)
  assert proc.returncode == 0, proc.stderr[-2000:]
  rows = [json.loads(line) for line in (workdir / "requests.jsonl").read_text().splitlines()]
  assert [r["id"] for r in rows] == [f"mine-{i}" for i in range(5)]
  assert [r["status"] for r in rows] == ["finished"] * 5
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["run_info"]["workload"]["kind"] == "python"
  assert summary["run_info"]["workload"]["path"] == "my_workloads:rows"
