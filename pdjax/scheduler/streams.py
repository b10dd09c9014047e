"""Layer-group KV streaming in the driver (kv.stream_layers > 0, disaggregated runs): a prompt's
decode instance is chosen when its last prefill chunk is dispatched, not after it, so that its
KV can travel layer group by layer group while the step computes (the engine:
engine/layer_groups.py; the simulator: sim/instance.py's streamed transfer). A mixin of
`Driver`; pure Python.

At dispatch (`_bind_streams`): for each chunk that completes a fresh prompt of at least
kv.stream_min_tokens tokens bound for the decode tier (and asking for more than its first
token: one that stops there never decodes), when no prefilled request is already
waiting for a decode slot (they go first), the decode router picks an instance with room among
those a transfer could use now; the slot is reserved and the pages allocated there (a prefix
the decode instance caches is reused: only the rest travels), exactly as a transfer after
prefill would. The instance's prefill call gets the streams and returns their transfers in
flight. At collection (`_stream_collected`) the request's transfer is already on its way: it
joins the transfers the loop polls (`Transfers._poll_transfers`), which lands it as any other
— its `transfer_start_s` is the step's dispatch, so `Request.transfer_exposed_s` is the part
after the prefill ended. Nothing else changes: a failed streamed transfer is a failed attempt
(retried whole, through the transfer queue, then the failure policy); a step that fails or
is not run, a request that ends at its first token or is cancelled, and a decode instance that
dies before the collection release the binding (pages and slot) or send the request the
usual way.
"""

from __future__ import annotations

from pdjax.request import Request
from pdjax.scheduler.instance_queue import InstanceQueue


class Streams:

  def _bind_streams(self, w: InstanceQueue, plan) -> list[tuple]:
    """The bindings of this prefill step's streamed prompts: [(request, decode worker, pages
    the decode instance had cached)]."""
    o = self.opts
    if (not o.stream_layers or self.mode != "disaggregated" or self.transfer_queue
        or not getattr(w.instance, "streams_kv", False) or self.injector.spec.transfer_delay):
      return []   # (injected transfer delays apply to whole transfers: none streamed then)
    bound = []
    for req, _, end in plan.chunks:
      if (end < req.prefill_len or w.keeps(req) or req.prefill_len < o.stream_min_tokens
          or req.sampling.max_new_tokens <= 1 or id(req) in self._cancels):
        continue
      need = req.prompt_len + 1          # as Transfers._start_transfers: the prompt + a slot
      eligible = [d for d in self.tier("decode")
                  if d.num_running() < d.max_batch and d.tables.can_allocate(need)]
      dst = self.policies.decode_router.choose(req, eligible)
      if dst is None:
        break                            # the decode tier is full: the rest wait as usual
      hit = dst.tables.allocate_prefix(req.id, req.prefill_tokens, need, self._salt(req),
                                       self.clock.now(), owner=req.tenant)
      if self._offload_failed(dst):      # (dst died evicting: this one goes the usual way)
        continue
      dst.reserve(req)
      req.decode_cached_tokens = hit
      bound.append((req, dst, hit // o.page_size))
    return bound

  def _stream_calls(self, w: InstanceQueue, bound: list[tuple]) -> list[tuple]:
    """The instance's `streams` argument: (decode instance, source pages, destination pages)
    per binding, the pages the decode instance had cached left out."""
    out = []
    for req, dst, skip in bound:
      src_pages = w.tables.block_table(req.id)
      out.append((dst.instance, src_pages[skip:],
                  dst.tables.block_table(req.id)[skip:len(src_pages)]))
    return out

  def _stream_collected(self, req: Request, src: InstanceQueue, step) -> bool:
    """req's last chunk was collected: its streamed transfer joins those in flight. False if it
    was not streamed, or its decode instance died meanwhile (it then goes the usual way)."""
    for i, (r, dst, _) in enumerate(step.streams):
      if r is not req:
        continue
      sent = _sent(step.pending)
      if dst.dead or req.id not in dst.tables:
        _abandon(sent, i)
        self._release_stream(req, dst)
        return False
      req.transfer_start_s = step.dispatched_s
      step.streams[i] = (req, None, None)   # (handed over: not released below)
      fails, _ = self.injector.transfer_attempt(req, self._attempts.get(id(req), 0))
      if fails:                             # an injected failure, as for a whole transfer
        self.transfers.append({"bytes": 0, "seconds": self.clock.now() - req.transfer_start_s,
                               "ok": False})
        self._transfer_failed(req, src, dst, f"{src.name}->{dst.name}: injected transfer "
                                             f"failure")
        return True
      self._in_transfer[id(req)] = (req, src, dst)
      self._pending_transfers.append((req, src, dst, sent[i]))
      self._maybe_cancel(req, "transfer")   # (an injected client cancel planned for then)
      return True
    return False

  def _release_streams(self, bound: list, pending=None) -> None:
    """Releases the bindings (a step's `streams`) that no transfer took over (the step failed
    or was not run, or its request ended at its first token); their transfers in flight, if
    the step was dispatched (`pending`), are abandoned."""
    sent = _sent(pending)
    for i, (req, dst, _) in enumerate(bound):
      if dst is not None:
        _abandon(sent, i)
        self._release_stream(req, dst)

  def _release_stream(self, req: Request, dst: InstanceQueue) -> None:
    if req in dst.running:
      return
    dst.release(req)
    if req.id in dst.tables:
      dst.tables.free(req.id, self.clock.now())
    self._touch(dst)


def _sent(pending) -> list | None:
  """A dispatched streaming step's transfers in flight (an injected slowdown wraps the step)."""
  return getattr(getattr(pending, "inner", pending), "streams", None)


def _abandon(sent: list | None, i: int) -> None:
  if sent is not None:
    abandon_transfer(sent[i])


def abandon_transfer(transfer) -> None:
  """A transfer in flight is not waited for: its destination pages are about to be released.
  One whose late landing could still write them (a Ray pull) has `abandon()`, which makes
  sure it never lands; an in-process one lands in dispatch order, before any later step on
  those pages, and a simulated one copies nothing until polled."""
  abandon = getattr(transfer, "abandon", None)
  if abandon is not None:
    abandon()
