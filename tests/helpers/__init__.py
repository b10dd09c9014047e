"""Shared test helpers, imported as `from helpers.<module> import ...` from any test folder
(tests/ is on sys.path: see the comment at the top of tests/conftest.py).

fake_engine     fake instances and a manual clock for driver, server and fault tests (no jax)
server_process  `python -m pdjax.serve` as a subprocess on a free loopback port
kernel_cases    paged-attention cases and tolerances shared by the kernel tests
sim_snapshots   the golden simulator snapshots' configs (tests/snapshots/) and their writer
hf_reference    transformers' greedy tokens for a list of prompts (the reference runs compare to)
paths           the repository root, tests/, tests/fixtures/ and tests/snapshots/ as paths
import_walk     which modules a repo file imports (ast), for the layering and no-jax tests
user_study      a study folder of the user's own policies and the check that requests went
                where they say (engine, Ray, server and sweep tests of issue 46)
"""
