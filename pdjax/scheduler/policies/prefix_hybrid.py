"""prefix_hybrid: skip disaggregation when little of the prompt is left to compute (llm-d's
prefix-based decider). The tokens a decode instance would still have to prefill are the prompt
minus the longest prefix some decode instance holds in its prefix cache (host-tier pages
after it weighted as in `InstanceQueue.prefix_credit`); when that is under
`length_threshold`, the request is prefilled and decoded on the decode tier (the decode router
then picks the instance, e.g. kv_aware_prefix or session_sticky); otherwise it goes
disaggregated. Without prefix caches this is length_hybrid."""

from pdjax.kv.prefix_cache import prefix_names, salt_for
from pdjax.scheduler.policies.always_disagg import DISAGG
from pdjax.scheduler.policies.base import PathChoice, PathPolicy


class PrefixHybrid(PathPolicy):

  def __init__(self, length_threshold: int = 128, shared_salt: str = "", **_):
    self.threshold, self.shared_salt = length_threshold, shared_salt

  def choose(self, req, prefill_tier, decode_tier):
    tokens = req.prefill_tokens
    cached = 0
    if decode_tier:
      page_size = decode_tier[0].page_size
      salt = salt_for(req.tenant, self.shared_salt, req.cache_salt)
      names = prefix_names(salt, tokens, page_size)
      cached = max(w.prefix_credit(names, salt) for w in decode_tier) * page_size
    if len(tokens) - cached < self.threshold:
      return PathChoice("colocated", "decode")
    return DISAGG
