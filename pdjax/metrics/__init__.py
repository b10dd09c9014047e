"""Serving metrics (TTFT, TPOT, ITL, E2E, SLO attainment, goodput) and run reports."""
