"""Fault injection: what may go wrong in a run (spec) and the seeded decisions (injector)."""
