"""Collecting a finished step: each prefill chunk's KV becomes computed (and cacheable); a
completed prefill either starts decoding where it is or joins the transfer queue; every
sampled token is appended, finishing requests at EOS or max_new_tokens (pages freed, their
full pages named for the prefix cache). A DeviceError fails only the step's requests; a step
dispatched ahead on the tokens of a step that failed at dispatch in a Ray actor was never run
(StepNotRun): its other requests are planned again, and no further step goes ahead of it.
With overlap, the step dispatched ahead becomes the one in flight; its rows for requests that
finished at this step (EOS, a cancel, a failure) are dropped when it is collected, so no
token past a stop is ever emitted.
A mixin of `Driver`; pure Python."""

from __future__ import annotations

from pdjax.request import Request, Status
from pdjax.errors import (DeviceError, HostTierLost, InstanceLost, ReloadFailed,
                                    RemoteStoreLost, StepNotRun)
from pdjax.scheduler.instance_queue import InstanceQueue


class Collect:

  def _collect(self, w: InstanceQueue) -> None:
    step, w.inflight, w.ahead = w.inflight, w.ahead, None
    self._touch(w)
    plan = step.plan
    done_s = self.clock.now()   # the step was observed done (host phases: on the run's clock,
                                # so a simulated run's are virtual, hence deterministic)
    if self._ahead_of_failed.get(id(w)) is step:
      del self._ahead_of_failed[id(w)]
    try:
      tokens = step.pending.result()
    except InstanceLost as e:   # its process died: the instance is dead, its requests move
      self._release_streams(step.streams, step.pending)
      self._kill(w, why=f"lost its process ({e})", injected=False)
      return
    except StepNotRun:          # dispatched ahead on the tokens of a step that failed
      self._release_streams(step.streams, step.pending)
      self._not_run(w, plan)
      return
    except ReloadFailed as e:   # its reloads never arrived (store gone, seal refused): not run
      self._release_streams(step.streams, step.pending)
      self._recompute_prefills(w, plan, e)
      if w.inflight is not None and w.inflight.ahead:
        self._ahead_of_failed[id(w)] = w.inflight
      return
    except DeviceError as e:
      self._release_streams(step.streams, step.pending)
      self._fail_plan(w, plan, f"{step.kind} step failed on {w.name}: {type(e).__name__}: {e}")
      if w.inflight is not None and w.inflight.ahead:
        # dispatched on this step's tokens: it fails or is not run; nothing more goes ahead
        # of it, so the requests it holds are planned again once it is collected
        self._ahead_of_failed[id(w)] = w.inflight
      return
    now = self.clock.now()
    readback_s = now - done_s
    if w.inflight is not None:    # the step dispatched ahead runs from now on
      w.inflight.start_s = max(w.inflight.start_s, now)
    w.measure(step, now)
    pending = step.pending
    self.steps.add((w.name, w.role, step.kind, step.start_s, now,   # records.STEP_FIELDS
                    len(plan.chunks) + len(plan.decodes), plan.num_tokens, step.ahead,
                    step.dispatched_s, done_s, step.plan_s, step.dispatch_s,
                    getattr(pending, "build_s", 0.0), readback_s, self._host_wait(w, step)))
    for (req, _, end), token in zip(plan.chunks, tokens):
      if id(req) in self._cancels or req.status.terminal:
        continue                       # cancelled while in flight: dropped next turn
      req.num_computed_tokens = end
      w.tables.cache_computed(req.id, end, now)
      if end < req.prefill_len:
        continue                       # a partial chunk: its sampled token means nothing
      w.waiting.remove(req)
      if self._non_finite(w, req, token, now):
        continue
      if req.output_ids:               # a recomputed sequence (preempted, or moved) resumes
        req.status, req.decode_instance = Status.DECODING, w.name
        if req.decode_start_s is None:
          req.decode_start_s = now
        w.join(req)
        continue
      stays = w.keeps(req)
      req.prefill_end_s = now
      if self._emit(w, req, token, now):
        continue
      if stays:
        req.status, req.decode_instance, req.decode_start_s = Status.DECODING, w.name, now
        w.join(req)
      else:
        req.status = Status.TRANSFERRING
        if step.streams and self._stream_collected(req, w, step):
          continue                     # its KV is on its way already (streams.py)
        self.transfer_queue.append((req, w))
        self._held_since[id(req)] = now
        self._maybe_cancel(req, "transfer_wait")
    if step.streams:
      self._release_streams(step.streams, step.pending)      # (the bindings no transfer took over)
    cancels, cancel_plans = self._cancels, self._cancel_plans
    for req, token in zip(plan.decodes, tokens[len(plan.chunks):] if plan.chunks else tokens):
      if req.status.terminal or (cancels and id(req) in cancels):
        continue                       # (terminal: it stopped at the step before this one)
      if (not self._non_finite(w, req, token, now) and not self._emit(w, req, token, now)
          and cancel_plans):
        self._maybe_cancel(req, "decode", len(req.output_ids))
    # Nothing in flight while work is left: the device waits for the host from `done_s` (the
    # readback, this collection, the next plan and dispatch) — what overlap removes.
    w.host_wait_from = done_s if w.inflight is None and (w.running or w.waiting) else None
    self._offload_failed(w)   # naming computed pages may evict (a capacity-bound cache)

  def _not_run(self, w: InstanceQueue, plan) -> None:
    """A step the instance never launched (StepNotRun): nothing it planned happened, so its
    requests stay where they are (waiting or running, their pages kept) and are planned
    again; those it shared with the failed step before it are already terminal."""
    self.fault_counts["steps_not_run"] = self.fault_counts.get("steps_not_run", 0) + 1
    self._touch(w)

  def _recompute_prefills(self, w: InstanceQueue, plan, error: ReloadFailed) -> None:
    """A step not run because its reloads never arrived: the host tier it reloaded from is
    gone (HostTierLost, RemoteStoreLost: that tier is lost for the rest of the run), or a
    sealed page from another node did not open. Its prompts start over without them (their
    pages, some meant to be reloaded, are freed; they wait at the front), its decode rows are
    planned again."""
    key = ("host_tier_lost_steps" if isinstance(error, (HostTierLost, RemoteStoreLost))
           else "reload_failed_steps")
    self.fault_counts[key] = self.fault_counts.get(key, 0) + 1
    now = self.clock.now()
    for req in dict.fromkeys(r for r, _, _ in plan.chunks):
      if req.status.terminal:
        continue
      if req.id in w.tables:
        w.tables.free(req.id, now)
      if req in w.running:
        w.running.remove(req)
      if req in w.waiting:
        w.waiting.remove(req)
      req.num_computed_tokens = 0
      req.status = Status.WAITING
      w.waiting.appendleft(req)
    self._touch(w)

  def _host_wait(self, w: InstanceQueue, step) -> float:
    """Seconds the instance sat idle with work to do before `step` was dispatched."""
    since, w.host_wait_from = w.host_wait_from, None
    return 0.0 if since is None else max(step.start_s - since, 0.0)

  def _non_finite(self, w: InstanceQueue, req: Request, token: int, now: float) -> bool:
    """A negative token is the engine's mark for non-finite logits: the request fails."""
    if token >= 0:
      return False
    w.forget(req)
    w.tables.free(req.id, now)
    self._finish(req, Status.FAILED, now,
                 "the model produced non-finite logits (NaN/inf); no token was sampled")
    return True

  def _emit(self, w: InstanceQueue, req: Request, token: int, now: float) -> bool:
    """Appends a generated token; finishes the request (freeing its pages) when it is done:
    EOS, max_new_tokens, or the run's listener says so (a server's stop string)."""
    done = req.add_token(token, now)
    if len(req.token_times) == 1:
      self.policies.path.observe_first_token(req)   # (the guard: a no-op unless the policy has it)
    if self._listener is not None and self._listener.on_token(req):
      done = req.stopped_by_listener = True
    if not done:
      return False
    self._finish_done(w, req, now)
    return True

  def _finish_done(self, w: InstanceQueue, req: Request, now: float) -> None:
    """req generated its last token: it leaves w, its full pages stay cached, its pages
    return to the pool."""
    w.forget(req)
    if w.tables.cache is not None:
      # The KV now holds the prompt and every generated token but the last: name its full
      # pages so a follow-up turn that repeats this conversation can hit them.
      w.tables.cache_computed(req.id, req.prompt_len + len(req.output_ids) - 1, now,
                              token_ids=list(req.prompt_ids) + req.output_ids[:-1])
    w.tables.free(req.id, now)
    w.measure_intervals(req)
    self._finish(req, Status.FINISHED, now)
