"""Serves a list of requests on one mode's instances with the driver and checks the end-of-run
invariants.

Shared by `pdjax.run` (experiments, through `pdjax.runner.execute`), `pdjax.serve` (online,
through `pdjax.server`), `pdjax.generate` (offline generation) and `pdjax.calibrate`.
"""

from __future__ import annotations

import dataclasses

from pdjax.request import Request
from pdjax.scheduler.clock import WallClock
from pdjax.scheduler.driver import Driver, DriverOptions, RunResult
from pdjax.scheduler.instance_queue import InstanceQueue


def driver_options(opts, max_decode_batch: int, pool_pages: int | None = None) -> DriverOptions:
  """pool_pages: the smallest instance pool (default opts.num_pages): a request that cannot
  fit it is rejected up front."""
  return DriverOptions(token_budget=max(opts.prefill_buckets),
                       max_prefill_seqs=opts.max_prefill_seqs,
                       max_decode_batch=max_decode_batch, max_model_len=opts.max_model_len,
                       pool_pages=pool_pages or opts.num_pages, page_size=opts.page_size)


def serve(mode: str, instances: list, requests: list[Request],
          on_progress=None, inbox=None, listener=None, **kwargs) -> RunResult:
  """Serves `requests` (and an `inbox`'s, until it closes) on `instances` with `make_driver`'s
  driver (kwargs: its arguments), then checks the end-of-run invariants. inbox / listener:
  online serving (see Driver.run)."""
  driver = make_driver(mode, instances, **kwargs)
  result = driver.run(requests, on_progress=on_progress, inbox=inbox, listener=listener)
  check_end_state(result, result.instances)
  return result


def make_driver(mode: str, instances: list, policies=None, clock=None, transfer_fn=None,
                injector=None, spill_dir: str | None = None, remesh_builder=None,
                remesh_drain: str = "migrate", **overrides) -> Driver:
  """The driver of one run on `instances`. policies: a `pdjax.scheduler.policies.Policies`
  (default: least_loaded routers, always_disagg, no admission control, prefill_first, no role
  switching). clock and transfer_fn default to the real engine's (wall clock, device KV
  transfer); the simulator passes its virtual clock and simulated transfer. injector: a
  FaultInjector (default: no faults); spill_dir: where a long-lived run keeps its records
  (Driver); remesh_builder / remesh_drain: re-meshing (scheduler/remesh.py); overrides:
  DriverOptions fields (shared_salt, lease_s, vocab_size, ...; overlap also takes "auto", the
  default: see `resolve_overlap`)."""
  opts = instances[0].opts
  overrides["overlap"] = resolve_overlap(overrides.get("overlap", "auto"), instances)
  max_batch = max(opts.decode_buckets)
  workers = [InstanceQueue(inst, inst.role, max_batch) for inst in instances]
  if transfer_fn is None:
    from pdjax.engine.transfer import transfer_kv_async as transfer_fn
  pool = min(inst.tables.allocator.num_pages for inst in instances)
  options = dataclasses.replace(driver_options(opts, max_batch, pool), **overrides)
  return Driver(mode, workers, options=options, clock=clock or WallClock(),
                transfer_fn=transfer_fn, policies=policies, injector=injector,
                spill_dir=spill_dir, remesh_builder=remesh_builder, remesh_drain=remesh_drain)


def resolve_overlap(setting, instances: list) -> bool:
  """scheduler.overlap: True / False, or "auto": on where every instance overlaps by default
  (`overlap_by_default`: the real engine on TPU and GPU). On the CPU backend "auto" is off: with
  a step queued behind another and KV transfers landing, jax's asynchronous CPU runtime hung
  (a step that never became ready, every XLA thread idle) in 3 of 4 runs of
  tests/faults/test_faults_engine.py's slow-instance test; `True` still forces it there."""
  setting = OVERLAP_SETTINGS.get(setting, setting) if isinstance(setting, str) else setting
  if setting == "auto":
    return all(getattr(i, "overlap_by_default", False) for i in instances)
  if not isinstance(setting, bool):
    raise ValueError(f"overlap must be true, false or 'auto', got {setting!r}")
  return setting


OVERLAP_SETTINGS = {"auto": "auto", "true": True, "on": True, "false": False, "off": False}


def flush_tenant(instances: list, tenant: str, shared_salt: str = "") -> int:
  """Forgets every cached page of `tenant` on every instance (its data can no longer be hit,
  so no later request can reuse or time it); pages live requests still use stay theirs.
  With a shared salt, tenants share names and the whole shared cache is flushed. Returns the
  number of pages forgotten."""
  from pdjax.kv.prefix_cache import flush_tenant as flush
  return flush([inst.tables for inst in instances], tenant, shared_salt)


def kv_pages_leaked(instances: list) -> int:
  return sum(inst.tables.num_used_pages for inst in instances)


class InvariantViolation(AssertionError):
  """The end-of-run check failed: the run's results cannot be trusted."""


def check_end_state(result: RunResult, instances: list) -> None:
  """Fails the run loudly unless every request is in exactly one terminal state, the status
  counts add up, every pool's bookkeeping holds, no block table is left and every page is
  free (idle prefix-cached pages count as free)."""
  open_requests, ids, by_status = [], set(), {}
  for r in result.requests:   # one pass: a long-lived server's requests are read from disk
    if not r.status.terminal:
      open_requests.append(r.id)
    if r.id in ids:
      raise InvariantViolation(f"request id {r.id!r} appears twice in the run's results")
    ids.add(r.id)
    by_status[r.status.value] = by_status.get(r.status.value, 0) + 1
  if open_requests:
    raise InvariantViolation(f"requests not terminal at the end of the run: {open_requests[:5]}")
  if sum(by_status.values()) != len(result.requests):
    raise InvariantViolation(f"status counts {by_status} do not add up to {len(ids)}")
  for inst in instances:
    inst.tables.check_invariants()
    if len(inst.tables):
      raise InvariantViolation(f"{inst.name}: {len(inst.tables)} block tables left at the end "
                               f"(e.g. {inst.tables.seq_ids[0]})")
    if inst.tables.num_used_pages:
      raise InvariantViolation(f"{inst.name}: {inst.tables.num_used_pages} KV pages not "
                               f"returned to the pool")


def check_outputs_alone(requests: list[Request], mcfg, params, limit: int = 0,
                        dtype: str = "float32") -> int:
  """Debug check that no request's output holds another request's tokens: each finished
  greedy request's output tokens, fed back one by one, are the greedy tokens of the same
  prompt run alone through the no-cache reference, computed like the run (its params, in its
  dtype, model.dtype). float32: exactly the reference's argmax at every token. bfloat16: the
  reference's argmax or a rounding tie with it (programs.TIE_EPS), since the paged and dense
  programs round differently. An EOS (unless ignore_eos) may only be the last token. Raises
  InvariantViolation at the first difference; returns how many were checked (at most `limit`
  when > 0)."""
  from pdjax.engine import programs
  checked = 0
  for r in requests:
    if r.status.value != "finished" or r.sampling.temperature > 0:
      continue
    if limit and checked >= limit:
      break
    eos = () if r.sampling.ignore_eos else r.eos_ids
    i = programs.reference_mismatch(params, mcfg, r.prompt_ids, r.output_ids, eos_ids=eos,
                                    dtype=dtype)
    if i is not None:
      raise InvariantViolation(f"request {r.id}: output differs from the same request run "
                               f"alone from token {i} on")
    checked += 1
  return checked
