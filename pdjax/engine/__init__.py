"""Everything that touches devices: meshes, programs, instances, sampling and KV transfer (jax).

`instance.Instance` is one serving instance (a sub-mesh, its params, its KV pool, its compiled
programs; the driver's contract: scheduler/instance_contract.py); `cluster` builds a mode's
instances on the local devices; `mesh` splits the devices; `programs` and `sampling` are the
pure device programs, `batch` their padded metadata, `attention` the attention implementation;
`transfer` moves KV pages between instances, `host_copies` to and from the host KV tier;
`options.EngineOptions` the page geometry and buckets; `runtime` maps runtime failures to
DeviceError; `step_timing` measures the engine for the simulator's calibration;
`hf_to_orbax` is the library half of `python -m pdjax.convert`.
"""
