"""Fault injection: what may go wrong in a run and the seeded decisions. Pure Python.

`spec.FaultSpec` is the `faults.*` config, validated; `injector.FaultInjector` draws each
decision (kill an instance, slow a step, fail or delay a transfer, cancel a request) from its
own stream keyed by (seed, request, what, attempt), so a request meets the same faults in
every mode and on both backends. The driver applies them (scheduler/recovery.py);
summary.json's `faults` reports them (metrics/faults.py).
"""
