"""KV transfers of the disaggregated path: pick a decode instance with room, reuse what its
prefix cache holds, move the rest, and hand the request to its running batch. A mixin of
`Driver`; pure Python.

A transfer is never waited for inside the loop: an injected delay lands later as an event,
and a transfer function that returns a pending object (the real engine's
`transfer_kv_async`, the simulator's `sim_transfer`) is polled each turn, so a slow link holds
only its own request. The source pages stay allocated until the landing is seen; the
destination's pages and decode slot are reserved at dispatch (so a burst of transfers cannot
overfill one decode batch) and released if the attempt fails; a failed attempt goes to the
recovery policy (`Recovery._transfer_failed`). Only `DeviceError` counts as a failed attempt:
any other exception from the transfer function is a bug and propagates, and a run in which
every transfer failed with the same device error raises at the end instead of reporting a
run of quiet recomputations.
"""

from __future__ import annotations

from pdjax.request import Request, Status
from pdjax.errors import DeviceError
from pdjax.scheduler.instance_queue import InstanceQueue

MAX_ERROR_REASONS = 32   # distinct transfer-error reasons counted apart (faults.transfer_errors)
OTHER_REASONS = "(other reasons)"


class Transfers:

  def _start_transfers(self) -> None:
    while self.transfer_queue:
      r, src = self.transfer_queue[0]
      if (id(r) in self._kv_on_decode and src.num_running() < src.max_batch and not src.dead
          and not src.paused and r.id in src.tables):
        # a re-mesh moved its KV onto this decode instance (no slot was free there then):
        # it joins the running batch with no transfer
        self._kv_on_decode.discard(id(r))
        self.transfer_queue.popleft()
        self._held_since.pop(id(r), None)
        now = self.clock.now()
        if r.transfer_end_s is None:
          r.transfer_start_s = r.transfer_start_s if r.transfer_start_s is not None else now
          r.transfer_end_s = now
        r.status, r.decode_instance = Status.DECODING, src.name
        if r.decode_start_s is None:
          r.decode_start_s = now
        src.join(r)
        self._touch(src)
        continue
      need = r.prompt_len + 1          # the prompt's KV plus the first decode step's slot
      eligible = [d for d in self.tier("decode")
                  if d.num_running() < d.max_batch and d.tables.can_allocate(need)]
      dst = self.policies.decode_router.choose(r, eligible)
      if dst is None:
        return   # decode tier full: the request waits (holding its prefill pages)
      self.transfer_queue.popleft()
      self._held_since.pop(id(r), None)
      # With a prefix cache on the decode instance (multi-turn sessions), the pages it already
      # holds are reused and only the rest move.
      hit = dst.tables.allocate_prefix(r.id, r.prefill_tokens, need, self._salt(r),
                                       self.clock.now(), owner=r.tenant)
      if self._offload_failed(dst):   # dst is dead (its pages gone): r picks another
        self.transfer_queue.appendleft((r, src))
        self._held_since[id(r)] = self.clock.now()
        continue
      skip = hit // self.opts.page_size
      r.decode_cached_tokens = hit
      dst.reserve(r)                   # the slot is dst's from dispatch until landing or failure
      r.transfer_start_s = self.clock.now()
      self._maybe_cancel(r, "transfer")
      fails, delay = self.injector.transfer_attempt(r, self._attempts.get(id(r), 0))
      why = "injected transfer failure" if fails else None
      if delay:
        # A stalled link holds only this request, never the loop: the attempt lands (or
        # times out) later, as an event, while every instance keeps stepping.
        timeout = self.opts.transfer_timeout_s
        if timeout and delay > timeout:
          delay, why = timeout, f"stalled past the {timeout:g} s transfer timeout"
        self._in_transfer[id(r)] = (r, src, dst)
        self._schedule(self.clock.now() + delay, "land", (r, src, dst, skip, why))
        continue
      self._complete_transfer(r, src, dst, skip, why)

  def _complete_transfer(self, r: Request, src: InstanceQueue, dst: InstanceQueue, skip: int,
                         why: str | None) -> None:
    """Moves r's KV from src to dst (unless this attempt already failed); on success r joins
    dst's running batch, on failure the recovery policy takes over."""
    src_pages, dst_pages = src.tables.block_table(r.id), dst.tables.block_table(r.id)
    result = None
    if why is None:
      # faults.tamper_prob: drawn for transfers between nodes only (the sealed ones)
      crosses = getattr(src.instance, "node", 0) != getattr(dst.instance, "node", 0)
      tamper = {"tamper": True} if crosses and self.injector.tamper_attempt(
          r, self._attempts.get(id(r), 0)) else {}
      try:
        result = self.transfer_fn(src.instance, src_pages[skip:], dst.instance,
                                  dst_pages[skip:len(src_pages)], **tamper)
      except DeviceError as e:
        why = self._device_failure(e)
    if result is not None and hasattr(result, "ready"):
      # Dispatched, not landed: the loop keeps stepping; _poll_transfers finishes it.
      self._in_transfer[id(r)] = (r, src, dst)
      self._pending_transfers.append((r, src, dst, result))
      return
    self._finish_transfer(r, src, dst, result, why)

  def _poll_transfers(self) -> None:
    """Finishes the dispatched transfers that have landed (either end may have died)."""
    if not self._pending_transfers:
      return
    still = []
    for r, src, dst, pending in self._pending_transfers:
      if not pending.ready():
        still.append((r, src, dst, pending))
        continue
      self._in_transfer.pop(id(r), None)
      if src.dead or dst.dead or r.id not in src.tables or r.id not in dst.tables:
        self._land(r, src, dst, 0, None)      # the same handling as a delayed landing
        continue
      try:
        result, why = pending.result(), None
      except DeviceError as e:
        result, why = None, self._device_failure(e)
      self._finish_transfer(r, src, dst, result, why)
    self._pending_transfers = still

  def _finish_transfer(self, r: Request, src: InstanceQueue, dst: InstanceQueue, result,
                       why: str | None) -> None:
    if result is None:
      now = self.clock.now()
      self.transfers.append({"bytes": 0, "seconds": now - r.transfer_start_s, "ok": False})
      self._transfer_failed(r, src, dst, f"{src.name}->{dst.name}: {why}")
      return
    self._transfer_succeeded(r)
    self.transfers_landed += 1
    src.tables.free(r.id, self.clock.now())
    dst.tables.cache_computed(r.id, r.prompt_len, self.clock.now())
    self._touch(src)
    self._touch(dst)
    r.transfer_end_s = self.clock.now()
    r.transfer_bytes, r.transfer_s = result.bytes, result.seconds
    r.transfer_group_ends_s = list(result.group_ends_s)
    ps = self.opts.page_size
    dst.measure_transfer(-(-r.prompt_len // ps) - r.decode_cached_tokens // ps, result.seconds)
    self.transfers.append({"bytes": result.bytes, "seconds": result.seconds, "ok": True})
    r.status, r.decode_instance, r.decode_start_s = Status.DECODING, dst.name, r.transfer_end_s
    dst.join(r)

  def _device_failure(self, e: DeviceError) -> str:
    why = f"{type(e).__name__}: {e}"
    # Counted by reason, at most MAX_ERROR_REASONS of them: a reason's text may hold epochs or
    # addresses, and a long-lived server must not keep one entry per failed attempt.
    key = why if (why in self.transfer_errors
                  or len(self.transfer_errors) < MAX_ERROR_REASONS) else OTHER_REASONS
    self.transfer_errors[key] = self.transfer_errors.get(key, 0) + 1
    return why

  def _check_transfers_not_all_failed(self) -> None:
    """A run whose every transfer attempt failed with one and the same device error is
    misconfigured or broken, not unlucky: fail it loudly (its tokens may still be right,
    recomputed, which is exactly what would hide it)."""
    if self.transfers_landed or len(self.transfer_errors) != 1:
      return
    (why, n), = self.transfer_errors.items()
    if n >= 2:
      raise RuntimeError(f"every KV transfer of the run failed ({n} attempts), all with: {why}")
