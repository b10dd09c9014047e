"""Collecting a finished step: each prefill chunk's KV becomes computed (and cacheable); a
completed prefill either starts decoding where it is or joins the transfer queue; every
sampled token is appended, finishing requests at EOS or max_new_tokens (pages freed, their
full pages named for the prefix cache). A DeviceError fails only the step's requests.
A mixin of `Driver`; pure Python."""

from __future__ import annotations

from pdjax.request import Request, Status
from pdjax.scheduler.errors import DeviceError
from pdjax.scheduler.worker import Worker


class Collect:

  def _collect(self, w: Worker) -> None:
    step, w.inflight = w.inflight, None
    self._touch(w)
    plan = step.plan
    try:
      tokens = step.pending.result()
    except DeviceError as e:
      self._fail_plan(w, plan, f"{step.kind} step failed on {w.name}: {type(e).__name__}: {e}")
      return
    now = self.clock.now()
    w.measure(step, now)
    self.steps.append({"instance": w.name, "role": w.role, "kind": step.kind,
                       "start_s": step.start_s, "end_s": now,
                       "num_seqs": len(plan.chunks) + len(plan.decodes),
                       "num_tokens": plan.num_tokens})
    for (req, _, end), token in zip(plan.chunks, tokens):
      if id(req) in self._cancels:
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
        self.transfer_queue.append((req, w))
        self._held_since[id(req)] = now
        self._maybe_cancel(req, "transfer_wait")
    for req, token in zip(plan.decodes, tokens[len(plan.chunks):]):
      if id(req) in self._cancels:
        continue
      if not self._non_finite(w, req, token, now) and not self._emit(w, req, token, now):
        self._maybe_cancel(req, "decode", len(req.output_ids))

  def _non_finite(self, w: Worker, req: Request, token: int, now: float) -> bool:
    """A negative token is the engine's mark for non-finite logits: the request fails."""
    if token >= 0:
      return False
    w.forget(req)
    w.tables.free(req.id, now)
    self._finish(req, Status.FAILED, now,
                 "the model produced non-finite logits (NaN/inf); no token was sampled")
    return True

  def _emit(self, w: Worker, req: Request, token: int, now: float) -> bool:
    """Appends a generated token; finishes the request (freeing its pages) when it is done."""
    if not req.add_token(token, now):
      return False
    w.forget(req)
    if w.tables.cache is not None:
      # The KV now holds the prompt and every generated token but the last: name its full
      # pages so a follow-up turn that repeats this conversation can hit them.
      w.tables.cache_computed(req.id, req.prompt_len + len(req.output_ids) - 1, now,
                              token_ids=list(req.prompt_ids) + req.output_ids[:-1])
    w.tables.free(req.id, now)
    self._finish(req, Status.FINISHED, now)
    return True
