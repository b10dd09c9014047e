"""cluster.launcher = "ray": one process per instance, placed and supervised by Ray.

    driver process (pdjax.run: workload, policies, scheduler loop, block tables, metrics)
        │  Ray actor calls: step(seq, rows) -> tokens, offer(uuid, pages), pull(uuid, pages)
        ▼
    one actor process per instance (its own devices, params, KV pool, compiled programs,
    and a jax.experimental.transfer server) ◄── KV pulled actor to actor ──► (no driver hop)

`RayCluster` starts a local Ray (cluster.ray_address empty) or joins one (an address such as
"ray://head:10001" or "auto"), creates the actors of each run, warms up their programs and the
transfer connections between them, and stops what it started. Devices per actor: on the CPU
backend each actor gets `tp` virtual devices of its own; with accelerator "gpu" Ray assigns
`num_gpus=tp`, with "tpu" the `TPU` resource (one actor per host or chip group).
"""

from __future__ import annotations

import logging
import os
import re
import warnings

import ray

from pdjax.distributed.actor import ActorSpec, InstanceActor
from pdjax.distributed.ray_transfer import RayTransfer
from pdjax.distributed.remote import RemoteInstance
from pdjax.kv.layer_groups import group_bounds

ACCELERATORS = ("auto", "cpu", "gpu", "tpu")
GROUP_BUNDLE_CPU = 0.001     # a multi-host instance's host: its placement bundle's CPU (a token:
                             # the bundle only places it; devices are the real resource)
PLACEMENT_TIMEOUT_S = 60.0   # the longest a multi-host instance waits to be placed


class RayCluster:

  def __init__(self, address: str = "", accelerator: str = "auto",
               transfer_host: str = "127.0.0.1", pull_timeout_s: float = 30.0,
               compile_cache_dir: str = "", transfer_timeout_s: float = 0.0):
    if accelerator not in ACCELERATORS:
      raise ValueError(f"accelerator must be one of {ACCELERATORS}, got {accelerator!r}")
    self.address, self.accelerator = address, accelerator
    self.transfer_host, self.compile_cache_dir = transfer_host, compile_cache_dir
    self.transfer_fn = RayTransfer(pull_timeout_s, transfer_timeout_s)   # (see RayTransfer)
    self._started_ray = False
    self._live: list[RemoteInstance] = []
    self._stores: dict[int, object] = {}   # node -> its KV store actor (node_store), once used
    self._node_ids: list[str] = []         # the run's nodes (cluster.nodes): Ray node ids
    self._hosts_by_role: dict[str, int] = {}   # roles whose instances span hosts (> 1)
    self._collective_timeout_s = 300.0
    self._groups: dict[str, object] = {}   # instance name -> its hosts' placement group

  def __enter__(self) -> "RayCluster":
    self.start()
    return self

  def __exit__(self, *exc) -> None:
    self.shutdown()

  def start(self) -> None:
    """Starts (or joins) Ray unless this process is already connected to one."""
    if ray.is_initialized():
      return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    with warnings.catch_warnings():
      # Ray starts its daemons with fork + exec; Python warns about forking a process that
      # has jax's threads, which only matters for a fork that keeps running Python.
      warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called",
                              category=RuntimeWarning)
      ray.init(address=self.address or None, include_dashboard=False,
               logging_level=logging.WARNING, configure_logging=True)
    self._started_ray = True

  def shutdown(self) -> None:
    """Kills every actor still alive, then leaves (or stops the local) Ray if it started it."""
    self.release(self._live)
    from ray.util.placement_group import remove_placement_group
    for pg in self._groups.values():
      remove_placement_group(pg)
    self._groups.clear()
    for store in self._stores.values():
      ray.kill(store, no_restart=True)
    self._stores.clear()
    if self._started_ray:
      ray.shutdown()
      self._started_ray = False

  def release(self, instances) -> None:
    for inst in list(instances):
      inst.kill()
      if inst in self._live:
        self._live.remove(inst)

  # ---- building a run's instances --------------------------------------------------------

  def build_instances(self, tiers: list[tuple[str, int, int]], mcfg, opts, *,
                      checkpoint: str = "", seed: int = 0, roles_may_change: bool = False,
                      opts_by_role: dict | None = None,
                      remesh_tps: dict | None = None, nodes: int = 1,
                      hosts_by_role: dict | None = None,
                      collective_timeout_s: float = 300.0) -> list[RemoteInstance]:
    """One actor per (role, index), all started and warmed up at once, then every transfer
    bucket run once between each sender and receiver (connections, first copies). The same
    programs as `engine.cluster.build_instances`. remesh_tps ({role: TPs}, re-meshing:
    distributed/remesh.py): the actors of those tiers also send and receive KV at each of
    those TPs (a re-mesh moves their requests' KV to the new actors). nodes
    (cluster.nodes): the actors fill that many Ray nodes in even blocks (kv/remote_store.py's
    nodes_of), each pinned to its node; 1: wherever Ray places them. hosts_by_role
    ({role: hosts}, cluster.<tier>.hosts): an instance of that role is that many actors, one
    per host, as one multi-controller JAX group (distributed/host_group.py)."""
    from pdjax.kv.remote_store import nodes_of
    self.use_nodes(nodes)
    self._hosts_by_role = {r: h for r, h in (hosts_by_role or {}).items() if h > 1}
    self._collective_timeout_s = collective_timeout_s
    remesh_tps = remesh_tps or {}
    tps = {role: tuple(sorted({tp for r, _, tp in tiers if r == role or roles_may_change}
                              | set(remesh_tps.get(role, ()))))
           for role in ("prefill", "decode")}
    instances = []
    placed = iter(nodes_of(sum(count for _, count, _ in tiers), nodes))
    for role, count, tp in tiers:
      for i in range(count):
        spec = ActorSpec(name=f"{role}-{i}", role=role, tp=tp, model=mcfg,
                         opts=(opts_by_role or {}).get(role, opts), checkpoint=checkpoint,
                         seed=seed, compile_cache_dir=self.compile_cache_dir,
                         transfer_host=self.transfer_host, node=next(placed))
        moves = role in remesh_tps
        sends = role == "prefill" or moves or (roles_may_change and role == "decode")
        receives = role == "decode" or moves or (roles_may_change and role == "prefill")
        to_tp = tuple(sorted(set(tps["decode"]) | (set(tps[role]) if moves else set())))
        instances.append(RemoteInstance(spec, self._new_actor, dict(
            prefill=True, decode=True, transfer_to_tp=to_tp if sends else (),
            receive=receives)))
        instances[-1].store_of = self.node_store
    if opts.stream_layers or any(o.stream_layers for o in (opts_by_role or {}).values()):
      for inst in instances:   # (prefill may stream KV by layer groups: ray_transfer.py)
        inst.kv_streamer = self.transfer_fn
    self._live += instances
    refs = [inst.start() for inst in instances]
    for inst, r in zip(instances, refs):
      inst.finish_start(r)
    self._warm_up_transfers(instances)
    return instances

  def _warm_up_transfers(self, instances, involving=None) -> None:
    """Every transfer bucket once between each sender and receiver of `instances` (with
    `involving`: only the pairs one of those is in)."""
    pulls = []
    for src in instances:
      for dst in instances:
        a, b = src._warm_up_args, dst._warm_up_args
        if src is dst or dst.tp not in a["transfer_to_tp"] or not b["receive"]:
          continue
        if involving is not None and src not in involving and dst not in involving:
          continue
        groups = (group_bounds(src.spec.model.num_layers, src.opts.stream_layers)
                  if src.opts.stream_layers else ())
        for n in src.opts.transfer_buckets:   # destination ids out of range: nothing written
          for layers in (None, *groups):       # (and each layer group's, when streaming)
            pulls.append((dst, self.transfer_fn.dispatch(src, [[0] * n], dst,
                                                         [[dst.opts.num_pages] * n], layers)))
    for _, t in pulls:
      t.result()     # (and settled: a taken offer never expires)

  def use_nodes(self, nodes: int) -> None:
    """The run's nodes: with 1, wherever Ray places an actor; else the first `nodes` alive
    Ray nodes, this process's own first, then by node id (one-line error when fewer)."""
    if nodes == 1:
      self._node_ids = []
      return
    own = ray.get_runtime_context().get_node_id()
    alive = sorted((n["NodeID"] for n in ray.nodes() if n["Alive"]), key=lambda n: (n != own, n))
    if len(alive) < nodes:
      raise ValueError(f"cluster.nodes={nodes} but the Ray cluster has {len(alive)} alive "
                       f"node(s)")
    self._node_ids = alive[:nodes]

  def _placement(self, node: int) -> dict:
    """Pins an actor to the run's node `node` (nothing with one node)."""
    if not self._node_ids:
      return {}
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    return dict(scheduling_strategy=NodeAffinitySchedulingStrategy(self._node_ids[node],
                                                                   soft=False))

  def node_store(self, node: int = 0):
    """The KV store actor (node_store.py) of the run's node `node`, started on that node on
    first use."""
    if node not in self._stores:
      from pdjax.distributed.node_store import NodeStore
      self._stores[node] = ray.remote(NodeStore).options(num_cpus=0,
                                                         **self._placement(node)).remote()
    return self._stores[node]

  def clear_store(self) -> None:
    """Empties the node stores between runs (each run has its own host tiers); a store that
    died during the run (a lost tier) is replaced by a new one when next used."""
    from pdjax.distributed.node_store import STORE_TIMEOUT_S
    for node, store in list(self._stores.items()):
      try:
        ray.get(store.clear.remote(), timeout=STORE_TIMEOUT_S)
      except ray.exceptions.RayActorError:
        del self._stores[node]
      except ray.exceptions.GetTimeoutError:   # (a wedged store: replaced, as a dead one)
        ray.kill(store, no_restart=True)
        del self._stores[node]

  def _new_actor(self, spec: ActorSpec):
    hosts = self._hosts_by_role.get(spec.role, 1)
    if hosts > 1:
      return self._new_host_group(spec, hosts)
    return ray.remote(InstanceActor).options(**self.actor_options(spec.tp),
                                             **self._placement(spec.node)).remote(spec)

  def _new_host_group(self, spec: ActorSpec, hosts: int):
    """Host 0 of a multi-host instance (it starts the others: host_group.py), each host's actor
    in its own bundle of a placement group: PACK on a local Ray (one machine), STRICT_SPREAD
    on a cluster joined by address (one host per Ray node). The group of an instance started
    again (after its death) replaces the old one's."""
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    from pdjax.distributed.host_group import HostGroup, HostGroupActor
    if spec.name in self._groups:
      remove_placement_group(self._groups.pop(spec.name))
    options = self.actor_options(spec.tp // hosts)
    bundle = {"CPU": GROUP_BUNDLE_CPU, **{k: v for k, v in (
        ("GPU", options.get("num_gpus")),) if v}, **options.get("resources", {})}
    strategy = "STRICT_SPREAD" if self.address else "PACK"
    if strategy == "STRICT_SPREAD":
      alive = sum(1 for n in ray.nodes() if n["Alive"])
      if alive < hosts:
        raise ValueError(f"cluster.{spec.role}.hosts={hosts} but the Ray cluster has {alive} "
                         f"alive node(s): one host per node")
    pg = placement_group([bundle] * hosts, strategy=strategy)
    try:
      ray.get(pg.ready(), timeout=PLACEMENT_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
      remove_placement_group(pg)
      raise ValueError(f"cluster.{spec.role}.hosts={hosts}: Ray could not place {hosts} hosts "
                       f"of {bundle} ({strategy}) within {PLACEMENT_TIMEOUT_S:g} s: the "
                       f"cluster has too few nodes or resources") from None
    self._groups[spec.name] = pg
    placed = [dict(options, num_cpus=GROUP_BUNDLE_CPU,
                   scheduling_strategy=PlacementGroupSchedulingStrategy(
                       pg, placement_group_bundle_index=i)) for i in range(hosts)]
    platform = "cpu" if "runtime_env" in options else "device"
    group = HostGroup(hosts, platform=platform,
                      collective_timeout_s=self._collective_timeout_s,
                      peer_options=tuple(placed[1:]))
    return ray.remote(HostGroupActor).options(**placed[0]).remote(spec, group)

  def actor_options(self, tp: int) -> dict:
    """Ray placement of a TP-tp instance (see the module doc)."""
    accelerator = self.accelerator
    if accelerator == "auto":
      import jax
      accelerator = jax.default_backend()
    if accelerator == "gpu":
      return dict(num_gpus=tp)
    if accelerator == "tpu":
      return dict(resources={"TPU": tp})
    flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "",
                   os.environ.get("XLA_FLAGS", ""))
    env = {"XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count={tp}".strip(),
           "JAX_PLATFORMS": "cpu"}
    return dict(num_cpus=0, runtime_env={"env_vars": env})
