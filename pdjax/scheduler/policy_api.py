"""The policy API: everything a scheduling policy may read, and nothing it may change.

A policy (router, path, admission, step, role switch, scorer; built-in or your own) is called
with read-only views, never the driver's own objects: an `InstanceView` per instance, a
`RequestView` per request. Writing to a view, or reading anything it does not publish, raises
AttributeError naming this module, so a policy cannot change the driver's state by mistake and
cannot come to depend on its internals. The same views are given on the engine (local and
Ray), in the server and in the simulator: a policy written against them runs on all four.

The driver wraps every policy in a guard (`scheduler/policy_guard.py`) that makes the views,
takes the policy's answer back to its own objects, and checks the answer is one it can use.

Of an instance (`InstanceView`):
  name, role ("prefill" | "decode" | "colocated"), tp, max_batch, page_size
  num_waiting(), queued_tokens()       requests waiting for (re)prefill here, and their tokens
  waiting, running, reserved           tuples of RequestView: FCFS queue, decoding batch, and
                                       requests holding a decode slot not running yet
  num_running()                        decode slots taken (running + reserved)
  free_pages(), total_pages(), used_pages(), reserved_pages()   its KV pool; reserved: pages
                                       promised here whose KV is still on its way
  kv_inbound_pages()                   KV pages in flight to it (the same pages)
  pages_for(tokens)                    pages `tokens` tokens take
  admitted(req)                        req already holds pages here
  keeps(req)                           a request prefilled here also decodes here
  prefix_cached_tokens(req, shared_salt="")   prompt tokens its prefix cache (and the node's
                                       host tier, weighted) would save req: a lookup
  prefix_credit(names, salt)           the same, in pages, for page names you computed
                                       (pdjax.kv.prefix_cache.prefix_names)
  prefill_tok_s, prefill_drain_tok_s, decode_step_s, token_interval_s, transfer_s_per_page
                                       measured rates (EWMA; None until measured)
  cost                                 its step cost model (sim/roofline.py, sim/calibrated.py;
                                       None on an uncalibrated engine)
  predicted_prefill_s(tokens), predicted_decode_s(extra_contexts=())   step seconds from
                                       the cost model (None without one)
  kv_bytes(pages)                      bytes of `pages` KV pages of this instance
  step_ends_s()                        when its steps in flight end (known on the virtual
                                       clock, else modelled; [] without a cost model)
  shares_host                          its steps share the host's cores with other instances
  drained()                            nothing waits, runs or is in flight
Of a request (`RequestView`):
  id, arrival_s, tenant, session, priority, cache_salt, sampling (SamplingParams, frozen)
  prompt_len, prompt_ids, prefill_len, prefill_tokens, max_len, num_computed_tokens
  output_len, output_ids (tokens so far), ttft_s, status, path, path_reason, fallbacks,
  preemptions
  slo                                  the run's SLO (ttft_s, tpot_s), or None
"""

from __future__ import annotations

import types
import typing


class Slo(typing.NamedTuple):
  ttft_s: float
  tpot_s: float


class _View:
  __slots__ = ()

  def __setattr__(self, name, value):
    raise AttributeError(f"{type(self).__name__}.{name} is read-only: a policy reads the "
                         "driver's state, it does not change it (pdjax/scheduler/policy_api.py)")

  def __getattr__(self, name):
    raise AttributeError(f"{type(self).__name__} has no {name!r}: a policy reads only what "
                         "pdjax/scheduler/policy_api.py publishes")


class RequestView(_View):
  """One request, read-only (see the module)."""
  __slots__ = ("_req", "_slo", "_prompt")

  def __init__(self, req, slo: Slo | None = None):
    object.__setattr__(self, "_req", req)
    object.__setattr__(self, "_slo", slo)
    object.__setattr__(self, "_prompt", None)

  def __repr__(self):
    return f"RequestView({self._req.id!r})"

  id = property(lambda self: self._req.id)
  arrival_s = property(lambda self: self._req.arrival_s)
  tenant = property(lambda self: self._req.tenant)
  session = property(lambda self: self._req.session)
  priority = property(lambda self: self._req.priority)
  cache_salt = property(lambda self: self._req.cache_salt)
  sampling = property(lambda self: self._req.sampling)
  prompt_len = property(lambda self: len(self._req.prompt_ids))
  prefill_len = property(lambda self: self._req.prefill_len)
  max_len = property(lambda self: self._req.max_len)
  num_computed_tokens = property(lambda self: self._req.num_computed_tokens)
  output_len = property(lambda self: len(self._req.output_ids))
  output_ids = property(lambda self: tuple(self._req.output_ids))
  prefill_tokens = property(lambda self: tuple(self._req.prefill_tokens))
  ttft_s = property(lambda self: self._req.ttft_s)
  status = property(lambda self: self._req.status.value)
  path = property(lambda self: self._req.path)
  fallbacks = property(lambda self: tuple(self._req.fallbacks))
  preemptions = property(lambda self: self._req.preemptions)
  slo = property(lambda self: self._slo)

  @property
  def prompt_ids(self) -> tuple:
    if self._prompt is None:
      object.__setattr__(self, "_prompt", tuple(self._req.prompt_ids))
    return self._prompt

  @property
  def path_reason(self):
    reason = self._req.path_reason
    return None if reason is None else types.MappingProxyType(reason)


class InstanceView(_View):
  """One instance's queue, batch, pool and measured rates, read-only (see the module)."""
  __slots__ = ("_q", "_request_view")

  def __init__(self, queue, request_view):
    object.__setattr__(self, "_q", queue)
    object.__setattr__(self, "_request_view", request_view)

  def __repr__(self):
    return f"InstanceView({self._q.name!r})"

  name = property(lambda self: self._q.name)
  role = property(lambda self: self._q.role)
  tp = property(lambda self: self._q.tp)
  max_batch = property(lambda self: self._q.max_batch)
  page_size = property(lambda self: self._q.tables.page_size)
  prefill_tok_s = property(lambda self: self._q.prefill_tok_s)
  prefill_drain_tok_s = property(lambda self: self._q.prefill_drain_tok_s)
  decode_step_s = property(lambda self: self._q.decode_step_s)
  token_interval_s = property(lambda self: self._q.token_interval_s)
  transfer_s_per_page = property(lambda self: self._q.transfer_s_per_page)
  cost = property(lambda self: getattr(self._q.instance, "cost", None))
  shares_host = property(lambda self: bool(getattr(self._q.instance, "shares_host", False)))

  @property
  def waiting(self) -> tuple:
    return tuple(map(self._request_view, self._q.waiting))

  @property
  def running(self) -> tuple:
    return tuple(map(self._request_view, self._q.running))

  @property
  def reserved(self) -> tuple:
    return tuple(map(self._request_view, self._q.reserved.values()))

  def num_waiting(self) -> int:
    return self._q.num_waiting()

  def queued_tokens(self) -> int:
    return self._q.queued_tokens()

  def num_running(self) -> int:
    return self._q.num_running()

  def free_pages(self) -> int:
    return self._q.free_pages()

  def total_pages(self) -> int:
    return self._q.total_pages()

  def used_pages(self) -> int:
    return self._q.tables.num_used_pages

  def kv_inbound_pages(self) -> int:
    return self._q.kv_inbound_pages()

  reserved_pages = kv_inbound_pages

  def pages_for(self, num_tokens: int) -> int:
    return self._q.pages_for(num_tokens)

  def admitted(self, req: RequestView) -> bool:
    return req.id in self._q.tables

  def keeps(self, req: RequestView) -> bool:
    return self._q.keeps(req._req)

  def prefix_credit(self, names: list, salt: str) -> float:
    return self._q.prefix_credit(names, salt)

  def prefix_cached_tokens(self, req: RequestView, shared_salt: str = "") -> int:
    from pdjax.kv.prefix_cache import prefix_names, salt_for
    tokens, page_size = req._req.prefill_tokens, self.page_size
    salt = salt_for(req.tenant, shared_salt, req.cache_salt)
    return int(self._q.prefix_credit(prefix_names(salt, tokens, page_size), salt) * page_size)

  def predicted_prefill_s(self, tokens: int) -> float | None:
    cost = self.cost
    return None if cost is None else cost.prefill_s([(int(tokens), 0)])

  def predicted_decode_s(self, extra_contexts=()) -> float | None:
    """One decode step of the running batch, plus rows of these context lengths."""
    cost = self.cost
    if cost is None:
      return None
    return cost.decode_s([r.prompt_len + len(r.output_ids) for r in self._q.running]
                         + [int(c) for c in extra_contexts])

  def kv_bytes(self, pages: int) -> int:
    return self._q.instance.kv_bytes(pages)

  def step_ends_s(self) -> list[float]:
    cost = self.cost
    if cost is None:
      return []
    return [step_end_s(cost, s) for s in self._q.steps_in_flight()]

  def drained(self) -> bool:
    return self._q.drained()


def step_end_s(cost, step) -> float:
  """When a step in flight ends: known on the virtual clock (a simulated step's `end_s`), else
  its start plus the cost model's seconds for its plan (a real step: prompt chunks, with the
  decode rows riding along as one-token chunks, or a decode step)."""
  end = getattr(step.pending, "end_s", None)
  if end is not None:
    return end
  plan = step.plan
  contexts = [r.prompt_len + len(r.output_ids) for r in plan.decodes]
  if plan.chunks:
    return step.start_s + cost.prefill_s([(stop - start, start) for _, start, stop in plan.chunks]
                                         + [(1, c - 1) for c in contexts])
  return step.start_s + cost.decode_s(contexts)


class Views:
  """One view per driver object, made on first use and kept (a policy may compare views by
  identity, as it would the instances: `w is not worker`)."""

  def __init__(self, slo: Slo | None = None):
    self.slo = slo
    self._instances: dict[int, InstanceView] = {}
    self._requests: dict[int, RequestView] = {}

  def request(self, req) -> RequestView:
    view = self._requests.get(id(req))
    if view is None or view._req is not req:
      view = self._requests[id(req)] = RequestView(req, self.slo)
    return view

  def forget(self, req) -> None:
    """req ended: its view goes (a long-lived driver must not keep one per request)."""
    self._requests.pop(id(req), None)

  def instance(self, queue) -> InstanceView:
    view = self._instances.get(id(queue))
    if view is None or view._q is not queue:
      view = self._instances[id(queue)] = InstanceView(queue, self.request)
    return view

  def instances(self, queues) -> list:
    return [self.instance(q) for q in queues]
