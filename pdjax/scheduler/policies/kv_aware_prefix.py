"""kv_aware_prefix: send a request where its first token comes soonest counting the prefix
cache, as Dynamo's KV router and SGLang's cache-aware router do.

cost(worker) = queued prompt tokens on the worker + the request's tokens that are not cached
there (cached tokens weighted by `prefix_weight`), ties broken by free KV pages, then running
sequences, then rotating (seeded: policies/ties.py). Pages the node's host tier holds after the
device prefix count as cached, weighted by what a reload saves against a recompute
(`InstanceQueue.prefix_credit`). With no cache on the instances this is least-queued-tokens routing.
The request's page names are computed once per request (same salt rule as the driver: its
tenant's, or `shared_salt`)."""

from pdjax.kv.prefix_cache import prefix_names, salt_for
from pdjax.scheduler.policies.base import Router
from pdjax.scheduler.policies.ties import RotatingTies


class KvAwarePrefix(Router):

  def __init__(self, prefix_weight: float = 1.0, shared_salt: str = "", seed: int = 0, **_):
    self.weight, self.shared_salt = prefix_weight, shared_salt
    self._ties = RotatingTies(seed)

  def choose(self, req, candidates):
    if not candidates:
      return None
    tokens = req.prefill_tokens
    page_size = candidates[0].page_size
    salt = salt_for(req.tenant, self.shared_salt, req.cache_salt)
    names = prefix_names(salt, tokens, page_size)
    def cost(w):
      saved = w.prefix_credit(names, salt) * page_size
      return (w.queued_tokens() + len(tokens) - self.weight * saved,
              -w.free_pages(), w.num_running())
    return self._ties.best(candidates, cost)
