"""Where things are, for tests in any folder under tests/: the repository root, tests/ and its
data folders (fixtures/ for workload traces and cases, snapshots/ for the simulator's goldens)."""

import pathlib

TESTS = pathlib.Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
FIXTURES = TESTS / "fixtures"
SNAPSHOTS = TESTS / "snapshots"
