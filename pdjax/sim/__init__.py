"""The simulated backend: instances whose step times come from a cost model, on a virtual clock.

The driver, policies, page allocator and metrics are the same objects as on the jax backend.
`instance.SimInstance` (and `build_sim_instances`, `sim_transfer`) is the instance; `transfer`
its transfer in flight, `host_handoff` the P -> D hand-off through the host tier; `digest` the
synthetic tokens' KV digests; the cost models: `roofline` (from `hardware` presets) and
`calibrated` (fit to a measured profile, `profiles/`); `host` a CPU shared by instances.
"""
