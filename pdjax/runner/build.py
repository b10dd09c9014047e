"""The instances of one run (real, simulated, or Ray actors), its scheduling policies, and the
arguments `serve_requests.serve` takes besides them, from a validated config."""

from __future__ import annotations

import os

from pdjax import config as config_lib
from pdjax import config_remesh
from pdjax.engine import options as options_lib


def _overlap(cfg):
  """scheduler.overlap as serve_requests.serve takes it (a command-line override arrives as
  text)."""
  value = cfg.scheduler.get("overlap", "auto")
  return value.lower() if isinstance(value, str) else value


def policies_for(cfg, run: str, opts):
  """The scheduling policies of one run (run: colocated | chunked | disaggregated | hybrid)."""
  from pdjax.runner import hybrid
  from pdjax.scheduler import policies as policy_lib
  sc = cfg.scheduler
  names = {key: sc[key] for key in policy_lib.CHOICES}
  if run == "chunked":
    names["colocated_policy"] = "chunked_prefill"
  elif run == "hybrid":   # (its step policy: hybrid.hybrid_step, below)
    names.update(path=hybrid.path_name(cfg), role_switch="none")
  elif cfg.mode in config_lib.COMPARED or run == "disaggregated":
    names["colocated_policy"] = "prefill_first"   # the plain baseline; D steps are decodes
  # a chunked step packs decodes with a chunk (the programs' rows); a whole-prompt step takes
  # at most scheduler.max_prefill_seqs prompts, whatever rows its programs have (mode=compare's
  # colocated run shares the chunked run's programs: build_run)
  step_seqs = (opts.max_prefill_seqs
               if names["colocated_policy"] == "chunked_prefill" or run == "hybrid"
               else sc.max_prefill_seqs)
  params = dict(token_budget=max(opts.prefill_buckets), chunk_budget=sc.chunk_budget,
                max_prefill_seqs=step_seqs, length_threshold=sc.length_threshold,
                saturation=sc.saturation, max_queue=sc.max_queue, slo_ttft_s=cfg.slo.ttft_s,
                slo_tpot_s=cfg.slo.tpot_s, interval_s=sc.role_switch_interval_s,
                queued_tokens=sc.role_switch_queued_tokens, shared_salt=cfg.kv.shared_salt,
                headroom=sc.get("admission_headroom", 1.0), isl_ratio=sc.get("isl_ratio", 0.7),
                remesh_schedule=sc.get("remesh_schedule", ""),
                remesh_cooldown_s=sc.get("remesh_cooldown_s", 5.0),
                local_prefill=local_prefill(cfg, run),
                latency_feedback=config_lib.latency_feedback(cfg),
                prefill_scorers=sc.get("prefill_scorers", "queue=2,prefix=3"),
                decode_scorers=sc.get("decode_scorers", "queue=2,prefix=3"))
  params["tier_budgets"] = hybrid.tier_budgets(cfg, run, params["token_budget"],
                                               params["local_prefill"])
  if sc.role_switch == "remesh":
    params["allowed_tps"] = config_remesh.remesh_tps(cfg, config_lib.model_config(cfg))
  policies = policy_lib.build(names, params, seed=cfg.seed,
                              policy_args=dict(sc.get("policy_args", None) or {}))
  if params["local_prefill"] == "chunked":
    from pdjax.scheduler.policies.chunked_prefill import ChunkedPrefill
    from pdjax.scheduler.policies.local_chunked import LocalChunked
    from pdjax.scheduler.policies.prefill_first import PrefillFirst
    whole = PrefillFirst(token_budget=params["token_budget"],
                         max_prefill_seqs=sc.max_prefill_seqs)
    policies.step = LocalChunked(whole, ChunkedPrefill(
        **{**params, "max_prefill_seqs": opts.max_prefill_seqs}))
  if run == "hybrid":
    policies.step = hybrid.hybrid_step(cfg, opts.max_prefill_seqs)
  return policies


def local_prefill(cfg, run: str) -> str:
  """How a decode instance of a disaggregated run prefills a prompt kept there
  (scheduler.local_prefill: whole | chunked); "whole" for the other runs."""
  if config_lib.RUNS[run] != "disaggregated":
    return "whole"
  return cfg.scheduler.get("local_prefill", "whole")


def generate_policies(mode: str, opts, chunk_budget: int):
  """pdjax.generate's policies (its --mode): chunked: colocated with chunked prefill; None (the
  driver's defaults) otherwise."""
  if mode != "chunked":
    return None
  from pdjax.scheduler import policies as policy_lib
  names = dict(prefill_router="least_loaded", decode_router="least_loaded",
               path="always_disagg", admission="none", colocated_policy="chunked_prefill",
               role_switch="none")
  return policy_lib.build(names, dict(token_budget=max(opts.prefill_buckets),
                                      chunk_budget=chunk_budget,
                                      max_prefill_seqs=opts.max_prefill_seqs))


def build_run(cfg, mcfg, run: str, host_params, ray_cluster=None, progress=None):
  """The instances of one run (real, simulated, or Ray actors) and what serve_requests.serve takes
  besides them: (mode, instances, serve kwargs: policies, injector, clock / transfer_fn for
  the simulator and Ray, and the DriverOptions the config sets). progress(done, total, what):
  each program the real engine compiles in this process (engine.cluster.build_instances)."""
  from pdjax.faults.injector import FaultInjector
  from pdjax.runner.hybrid import run_config
  cfg = run_config(cfg, run)   # (hybrid: its P-heavy and D-heavy tiers as prefill and decode)
  # (a colocated run beside a chunked one on the same placement takes the chunked run's
  # programs: one set compiled for both, runner/instance_pool.py)
  chunked = (run in ("chunked", "hybrid") or local_prefill(cfg, run) == "chunked"
             or (run == "colocated" and (cfg.scheduler.colocated_policy == "chunked_prefill"
                                         or "chunked" in config_lib.modes(cfg))))
  opts = options_lib.engine_options(cfg, chunked=chunked)
  mode = config_lib.RUNS[run]
  tiers = config_lib.tiers(cfg)[mode]
  serve_kwargs = {}
  if cfg.backend == "sim":
    from pdjax.scheduler.clock import ManualClock
    from pdjax.sim.instance import build_sim_instances, sim_transfer
    clock = ManualClock()
    instances = build_sim_instances(tiers, mcfg, opts, hardware=cfg.sim.hardware, clock=clock,
                                    link_gbps=cfg.sim.link_gbps,
                                    dtype_bytes=2 if cfg.model.dtype == "bfloat16" else 4,
                                    profile=config_lib.sim_profile(cfg, mcfg),
                                    opts_by_role=options_lib.tier_options(cfg, opts),
                                    hosts_by_role={role: cfg.cluster[role].get("hosts", 1)
                                                   for role, _, _ in tiers})
    serve_kwargs = dict(clock=clock, transfer_fn=sim_transfer,
                        fast_forward=bool(cfg.sim.get("fast_forward", True)))
  elif ray_cluster is not None:
    remesh_tps = None
    if mode == "disaggregated" and cfg.scheduler.role_switch == "remesh":
      remesh_tps = {role: tuple(tp for _, tp in lays) for role, lays in
                    config_remesh.remesh_layouts(cfg, mcfg).items() if lays}
    instances = ray_cluster.build_instances(
        tiers, mcfg, opts, checkpoint=cfg.model.checkpoint, seed=cfg.seed,
        roles_may_change=cfg.scheduler.role_switch == "queue_balance",
        opts_by_role=options_lib.tier_options(cfg, opts), remesh_tps=remesh_tps,
        nodes=cfg.cluster.get("nodes", 1),
        hosts_by_role={role: cfg.cluster[role].get("hosts", 1) for role, _, _ in tiers},
        collective_timeout_s=cfg.cluster.get("collective_timeout_s", 300.0))
    serve_kwargs = dict(transfer_fn=ray_cluster.transfer_fn)
    seal_key = None
    if cfg.kv.get("seal_cross_node", False):   # (the run's own key: distributed/sealed_kv.py)
      from pdjax.kv.seal import new_run_key
      seal_key = new_run_key()
    ray_cluster.transfer_fn.seal_key = seal_key
    for inst in instances:
      inst.seal_key = seal_key
  else:
    instances = _engine_instances(cfg, mcfg, tiers, host_params, opts, progress)
  if ray_cluster is None:   # (the Ray launcher placed its actors on their nodes)
    from pdjax.kv.remote_store import nodes_of
    for inst, node in zip(instances, nodes_of(len(instances), cfg.cluster.get("nodes", 1))):
      inst.node = node
  if cfg.cluster.get("nodes", 1) > 1:
    link = _cross_node_link(cfg)
    for inst in instances:   # (KV between two nodes crosses it: sim_transfer, sealing)
      inst.node_link = link
  prepare = _preparer(cfg, mcfg)
  for inst in instances:
    prepare(inst)
  if cfg.kv.get("remote_store", False):
    _attach_remote_stores(cfg, instances)
  if cfg.kv.get("host_tier_pages", 0):
    handoff = cfg.kv.get("host_tier_handoff", "transfer")
    if handoff == "host" and cfg.backend == "jax":
      from pdjax.engine.host_copies import transfer_through_host_tier
      serve_kwargs["transfer_fn"] = transfer_through_host_tier
  if mode == "disaggregated" and cfg.scheduler.role_switch == "remesh":
    serve_kwargs.update(remesh_builder=_remesh_builder(cfg, mcfg, instances, prepare,
                                                       host_params, progress, ray_cluster),
                        remesh_drain=cfg.scheduler.get("remesh_drain", "migrate"))
  kv = cfg.kv
  serve_kwargs.update(policies=policies_for(cfg, run, opts),
                      injector=FaultInjector(config_lib.fault_spec(cfg)),
                      shared_salt=kv.shared_salt, tenant_quota_pages=kv.tenant_quota_pages,
                      flush_schedule=config_lib.flush_schedule(cfg), vocab_size=mcfg.vocab_size,
                      transfer_failure_policy=kv.transfer_failure_policy,
                      transfer_retries=kv.transfer_retries,
                      transfer_backoff_s=kv.transfer_backoff_s,
                      transfer_timeout_s=kv.transfer_timeout_s, lease_s=kv.lease_s,
                      stream_layers=kv.get("stream_layers", 0) if mode == "disaggregated" else 0,
                      stream_min_tokens=kv.get("stream_min_tokens", 0),
                      debug=cfg.debug, overlap=_overlap(cfg),
                      slo_ttft_s=cfg.slo.ttft_s, slo_tpot_s=cfg.slo.tpot_s)
  return ("disaggregated" if mode == "hybrid" else mode), instances, serve_kwargs


def _engine_instances(cfg, mcfg, tiers, host_params, opts, progress) -> list:
  """The real engine's instances of a run: from the command's InstancePool when one is open
  (built by the first run of this placement, reset for the others), else built now. A
  re-meshing run builds its own (a re-mesh replaces and unloads instances)."""
  from pdjax.engine.cluster import build_instances
  from pdjax.runner.instance_pool import build_key, open_pool
  roles_may_change = cfg.scheduler.role_switch == "queue_balance"
  opts_by_role = options_lib.tier_options(cfg, opts)

  def build() -> list:
    return build_instances(tiers, mcfg, host_params, opts, roles_may_change=roles_may_change,
                           opts_by_role=opts_by_role, progress=progress)
  pool = open_pool()
  if pool is None or cfg.scheduler.role_switch == "remesh":
    return build()
  key = build_key(tiers, mcfg, host_params, opts, opts_by_role, roles_may_change)
  return pool.instances(key, host_params, build, run_seed=cfg.seed)


def _preparer(cfg, mcfg):
  """What every instance of the run gets once built (the first ones and a re-mesh's): the
  latency profile's cost (slo_headroom's predictions), the prefix cache, its node's host
  tier (one per node of the run, cluster.nodes: every instance of the node shares it)."""
  profile = config_lib.latency_profile(cfg, mcfg)
  node_tiers: dict[int, tuple] = {}   # node -> (its HostTier, host link bytes/s, hand-off)

  def host_tier(node: int) -> tuple:
    if node not in node_tiers:
      from pdjax.kv.host_tier import HostTier
      from pdjax.kv.offload_admission import make_admission
      from pdjax.sim.hardware import hardware_for
      gbps = cfg.sim.get("host_link_gbps", 0.0)
      admission = make_admission(cfg.kv.get("host_tier_admission", "all"),
                                 half_life_s=cfg.kv.get("host_tier_half_life_s", 60.0),
                                 memory=4 * cfg.kv.host_tier_pages)
      node_tiers[node] = (
          HostTier(cfg.kv.host_tier_pages, cfg.kv.host_tier_policy, admission, node=node),
          gbps * 1e9 / 8 if gbps else hardware_for(cfg.sim.hardware).host_bytes_per_s,
          cfg.kv.get("host_tier_handoff", "transfer"))
    return node_tiers[node]

  if profile is not None:   # (scheduler/policies/latency_model.py)
    import jax
    from pdjax.sim.calibrated import cost_from_profile
    # On the CPU every instance of this machine runs its programs on the same cores: a step
    # waits for the others' steps in flight (latency_model.host_wait_s)
    shares_host = jax.default_backend() == "cpu" and not cfg.cluster.get("ray_address", "")

  def prepare(inst) -> None:
    if profile is not None:
      inst.cost = cost_from_profile(profile, inst.tp, inst.opts)
      inst.shares_host = shares_host
    if cfg.kv.prefix_cache:
      inst.tables.enable_prefix_cache(cfg.kv.cache_pages, cfg.kv.ttl_s, cfg.kv.eviction)
    if cfg.kv.get("host_tier_pages", 0):
      inst.attach_host_tier(*host_tier(getattr(inst, "node", 0)))
  return prepare


def _attach_remote_stores(cfg, instances) -> None:
  """kv.remote_store: each instance may reload what its node's tier lacks from the other
  nodes' tiers when its cost model predicts that beats recomputing (kv/remote_store.py)."""
  from pdjax.kv.remote_store import RemoteReload
  tiers = {inst.tables.host.node: inst.tables.host for inst in instances}
  for inst in instances:
    node = inst.tables.host.node
    inst.tables.remote = RemoteReload(
        [t for n, t in sorted(tiers.items()) if n != node], recompute_s=inst.cost.prefill_s,
        page_bytes=inst.kv_bytes(1), page_size=inst.tables.page_size,
        link=_cross_node_link(cfg))


def _cross_node_link(cfg):
  """The link between the run's nodes (kv/remote_store.py), its host copies (a sealed
  transfer's) over sim.host_link_gbps or the hardware preset's host link."""
  from pdjax.kv.remote_store import CrossNodeLink
  from pdjax.sim.hardware import hardware_for
  gbps = cfg.sim.get("host_link_gbps", 0.0)
  return CrossNodeLink.from_config(
      cfg.kv, gbps * 1e9 / 8 if gbps else hardware_for(cfg.sim.hardware).host_bytes_per_s)


def _remesh_builder(cfg, mcfg, instances, prepare, host_params, progress, ray_cluster=None):
  """scheduler.role_switch=remesh: the simulator's builder (modelled phases), the Ray
  launcher's (new actors replace the old: distributed/remesh.py) or the engine's, its standby
  instances for the allowed layouts compiled now (engine/remesh.py)."""
  if ray_cluster is not None:
    from pdjax.distributed.remesh import RayRemeshBuilder
    return RayRemeshBuilder(ray_cluster, instances, prepare)
  if cfg.backend == "sim":
    import dataclasses
    from pdjax.sim.hardware import hardware_for
    from pdjax.sim.instance import SimInstance, sim_cost
    from pdjax.sim.remesh import SimRemeshBuilder
    from pdjax.sim.roofline import RooflineCost
    proto = {i.role: i for i in instances}
    profile = config_lib.sim_profile(cfg, mcfg)
    dtype_bytes = 2 if cfg.model.dtype == "bfloat16" else 4
    costs = {}

    from pdjax.sim.hardware import hardware_for
    hardware = hardware_for(cfg.sim.hardware)

    def cost_of(role, tp):   # (a re-meshed layout spans the fewest hosts that hold its chips)
      if (role, tp) not in costs:
        costs[role, tp] = sim_cost(mcfg, tp, proto[role].opts, hardware=cfg.sim.hardware,
                                   link_gbps=cfg.sim.link_gbps, dtype_bytes=dtype_bytes,
                                   profile=profile, hosts=hardware.hosts_for(tp))
      return costs[role, tp]

    def make(name, role, tp, num_pages):
      p = proto[role]
      inst = SimInstance(name, role, cost_of(role, tp),
                         dataclasses.replace(p.opts, num_pages=num_pages),
                         clock=p.clock, vocab_size=mcfg.vocab_size, eos_ids=mcfg.eos_token_ids,
                         host=p.host, num_layers=mcfg.num_layers)
      prepare(inst)
      return inst
    weight_bytes = RooflineCost(mcfg, hardware_for(cfg.sim.hardware), 1,
                                dtype_bytes=dtype_bytes).weight_bytes
    compile_s = (profile or {}).get("remesh_compile_s", cfg.sim.get("remesh_compile_s", 1.0))
    return SimRemeshBuilder(make, weight_bytes, compile_s, cost_of)
  from pdjax.engine.remesh import EngineRemeshBuilder
  opts_by_role = {i.role: i.opts for i in instances}
  builder = EngineRemeshBuilder(mcfg, opts_by_role, instances, prepare)
  builder.precompile(config_remesh.remesh_layouts(cfg, mcfg), host_params, progress=progress)
  profile = config_lib.latency_profile(cfg, mcfg)
  if profile is not None:   # the load-driven policy predicts layouts from it
    from pdjax.sim.calibrated import cost_from_profile
    builder.cost_of = lambda role, tp: (cost_from_profile(profile, tp, opts_by_role[role])
                                        if str(tp) in profile["instances"] else None)
  return builder


def ray_cluster_for(cfg):
  """A context holding the run's RayCluster (started on entry, stopped on exit) under
  cluster.launcher=ray; holding None otherwise."""
  import contextlib
  if config_lib.launcher(cfg) != "ray":
    return contextlib.nullcontext()
  from pdjax.distributed.launcher import RayCluster
  c = cfg.cluster
  return RayCluster(address=c.ray_address, accelerator=c.ray_accelerator,
                    transfer_host=c.transfer_host, pull_timeout_s=c.pull_timeout_s,
                    compile_cache_dir=os.path.expanduser(cfg.compile_cache_dir),
                    transfer_timeout_s=cfg.kv.transfer_timeout_s)
