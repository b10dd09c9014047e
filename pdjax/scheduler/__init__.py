"""The driver: the scheduler loop that serves requests on a set of instances, the same loop for
the real engine, the simulator and Ray actors. Pure Python (no jax).

`driver.Driver` is the loop (on the run's clock: `clock`); its parts are mixins, one concept
per file: `admission` (arrivals, static checks in `batching`), `steps` (dispatch), `collect`
(finished steps), `transfers` (P -> D KV moves), `recovery` (failures, cancellations,
restarts), `fast_forward` (decode chains on the virtual clock), `invariants`. `worker.InstanceQueue`
is its host-side view of one instance (queues, load signals; not vLLM's worker);
`instance_contract` states what it needs from an instance as Protocols; `policies/` the
routing, path, admission, step and role-switch policies; `errors` the failures it survives;
`inbox`, `tally` and `spill` serve a long-running server.
"""
