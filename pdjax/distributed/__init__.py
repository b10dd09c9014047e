"""Instances in their own processes (cluster.launcher = "ray").

`launcher.RayCluster` starts one Ray actor per instance (`actor` is its body) and builds the
run's instances and transfer function; `remote.RemoteInstance` is the driver's side of an actor
(the same contract as engine.Instance: scheduler/instance_contract.py); `ray_transfer` moves KV
actor to actor, never through the driver.
"""
