"""Moved to `pdjax.runner.serve_requests`; this re-export remains only until
pdjax/server/engine.py imports it from there (issue 26)."""

from pdjax.runner.serve_requests import (  # noqa: F401
    OVERLAP_SETTINGS, InvariantViolation, check_end_state, check_outputs_alone, driver_options,
    flush_tenant, kv_pages_leaked, make_driver, resolve_overlap, serve)
