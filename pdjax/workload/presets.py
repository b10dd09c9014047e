"""Named synthetic request mixes: what each request asks, separate from when it arrives.

A preset is `fn(n, rng, vocab_size, eos_ids, **params) -> list[RequestSpec]`, n specs in
arrival order, drawn from rng. Lengths fit the default max_model_len of 512 (prompt + output):
  mixed            chat_fraction chat requests, the rest documents (ranges from the config);
                   the long doc prefills interfere with the chat decodes.
  chat             prompts 16-96, outputs 16-64.
  long_doc_qa      prompts 256-448 sharing nothing, answers 4-16.
  rag              one 32-token system prefix shared by all + a passage of 128-256 tokens
                   (drawn from a pool of 16, so passages repeat) + a question of 8-24;
                   outputs 16-48.
  agent_multiturn  sessions of 2-4 turns; turn k+1's prompt is turn k's prompt + a synthetic
                   answer of turn k's max_new_tokens + 8-48 new user tokens, with the same
                   session id; first prompts 32-96, outputs 8-32. Up to 4 sessions are open
                   at once and their turns interleave (in order within a session).
  lognormal        prompt and output lengths log-normal with the configured means and sigma
                   (heavy-tailed, like ShareGPT conversations), clipped to configured maxima
                   (defaults: means 128 / 64, maxima 384 / 128).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from pdjax.workload.tokens import allowed_token_ids, random_prompt


@dataclasses.dataclass(frozen=True)
class RequestSpec:
  """What one request asks for; arrival time, id and sampling are added by the loader."""
  prompt_ids: list[int]
  max_new_tokens: int
  tenant: str = ""
  session: str = ""


def _check_range(name: str, bounds: tuple[int, int], minimum: int) -> tuple[int, int]:
  if len(bounds) != 2:
    raise ValueError(f"{name} must be a (min, max) pair, got {bounds!r}")
  lo, hi = int(bounds[0]), int(bounds[1])
  if lo > hi:
    raise ValueError(f"{name} is empty: min {lo} > max {hi}")
  if lo < minimum:
    raise ValueError(f"{name} must be >= {minimum}, got min {lo}")
  return lo, hi


def _uniform(rng: np.random.Generator, bounds: tuple[int, int]) -> int:
  return int(rng.integers(bounds[0], bounds[1] + 1))


def _simple(n: int, rng: np.random.Generator, allowed: np.ndarray, prompt: tuple[int, int],
            new: tuple[int, int]) -> list[RequestSpec]:
  specs = []
  for _ in range(n):
    prompt_len, max_new = _uniform(rng, prompt), _uniform(rng, new)
    specs.append(RequestSpec(random_prompt(rng, allowed, prompt_len), max_new))
  return specs


def mixed(n: int, rng: np.random.Generator, vocab_size: int, eos_ids: tuple[int, ...], *,
          chat_fraction: float = 0.75, chat_prompt_len: tuple[int, int] = (16, 64),
          chat_max_new_tokens: tuple[int, int] = (16, 48),
          doc_prompt_len: tuple[int, int] = (192, 448),
          doc_max_new_tokens: tuple[int, int] = (8, 24)) -> list[RequestSpec]:
  """Each request is chat with probability chat_fraction, else doc; lengths uniform in the
  inclusive ranges."""
  if not 0.0 <= chat_fraction <= 1.0:
    raise ValueError(f"chat_fraction must be in [0, 1], got {chat_fraction}")
  chat_prompt = _check_range("chat_prompt_len", chat_prompt_len, 1)
  chat_new = _check_range("chat_max_new_tokens", chat_max_new_tokens, 1)
  doc_prompt = _check_range("doc_prompt_len", doc_prompt_len, 1)
  doc_new = _check_range("doc_max_new_tokens", doc_max_new_tokens, 1)
  allowed = allowed_token_ids(vocab_size, eos_ids)
  is_chat = rng.random(n) < chat_fraction
  specs = []
  for i in range(n):
    prompt, new = (chat_prompt, chat_new) if is_chat[i] else (doc_prompt, doc_new)
    specs.extend(_simple(1, rng, allowed, prompt, new))
  return specs


def chat(n: int, rng: np.random.Generator, vocab_size: int,
         eos_ids: tuple[int, ...]) -> list[RequestSpec]:
  return _simple(n, rng, allowed_token_ids(vocab_size, eos_ids), (16, 96), (16, 64))


def long_doc_qa(n: int, rng: np.random.Generator, vocab_size: int,
                eos_ids: tuple[int, ...]) -> list[RequestSpec]:
  return _simple(n, rng, allowed_token_ids(vocab_size, eos_ids), (256, 448), (4, 16))


def lognormal(n: int, rng: np.random.Generator, vocab_size: int, eos_ids: tuple[int, ...], *,
              lognormal_prompt_mean: float = 128.0, lognormal_output_mean: float = 64.0,
              lognormal_sigma: float = 1.0, lognormal_max_prompt_len: int = 384,
              lognormal_max_output_len: int = 128) -> list[RequestSpec]:
  """Lengths exp(N(ln(mean) - sigma^2 / 2, sigma)) rounded (mean `mean` before clipping),
  clipped to [1, max] (benchmarks filter ShareGPT the same way, e.g. prompts <= 1024)."""
  allowed = allowed_token_ids(vocab_size, eos_ids)
  def draw(mean: float, cap: int) -> int:
    mu = np.log(mean) - lognormal_sigma ** 2 / 2
    return min(max(1, int(round(rng.lognormal(mu, lognormal_sigma)))), int(cap))
  specs = []
  for _ in range(n):
    prompt_len = draw(lognormal_prompt_mean, lognormal_max_prompt_len)
    max_new = draw(lognormal_output_mean, lognormal_max_output_len)
    specs.append(RequestSpec(random_prompt(rng, allowed, prompt_len), max_new))
  return specs


RAG_SYSTEM_LEN = 32
RAG_PASSAGES = 16


def rag(n: int, rng: np.random.Generator, vocab_size: int,
        eos_ids: tuple[int, ...]) -> list[RequestSpec]:
  allowed = allowed_token_ids(vocab_size, eos_ids)
  system = random_prompt(rng, allowed, RAG_SYSTEM_LEN)
  passages = [random_prompt(rng, allowed, _uniform(rng, (128, 256)))
              for _ in range(RAG_PASSAGES)]
  specs = []
  for _ in range(n):
    passage = passages[int(rng.integers(0, RAG_PASSAGES))]
    question = random_prompt(rng, allowed, _uniform(rng, (8, 24)))
    specs.append(RequestSpec(system + passage + question, _uniform(rng, (16, 48))))
  return specs


AGENT_OPEN_SESSIONS = 4


def _session(rng: np.random.Generator, allowed: np.ndarray, turns: int,
             session: str) -> list[RequestSpec]:
  prompt = random_prompt(rng, allowed, _uniform(rng, (32, 96)))
  specs = []
  for turn in range(turns):
    if turn:
      answer = random_prompt(rng, allowed, specs[-1].max_new_tokens)
      prompt = prompt + answer + random_prompt(rng, allowed, _uniform(rng, (8, 48)))
    specs.append(RequestSpec(prompt, _uniform(rng, (8, 32)), session=session))
  return specs


def agent_multiturn(n: int, rng: np.random.Generator, vocab_size: int,
                    eos_ids: tuple[int, ...]) -> list[RequestSpec]:
  """Sessions sess-00000.. until n turns (the last may be cut short); turns interleave."""
  allowed = allowed_token_ids(vocab_size, eos_ids)
  sessions, total = [], 0
  while total < n:
    turns = min(_uniform(rng, (2, 4)), n - total)
    sessions.append(_session(rng, allowed, turns, f"sess-{len(sessions):05d}"))
    total += turns
  pending = [list(reversed(s)) for s in sessions]   # Next turn at the end.
  open_, next_session, specs = [], 0, []
  while len(specs) < n:
    while len(open_) < AGENT_OPEN_SESSIONS and next_session < len(pending):
      open_.append(pending[next_session])
      next_session += 1
    k = int(rng.integers(0, len(open_)))
    specs.append(open_[k].pop())
    if not open_[k]:
      open_.pop(k)
  return specs


PRESETS: dict[str, Callable[..., list[RequestSpec]]] = {
    "mixed": mixed, "chat": chat, "long_doc_qa": long_doc_qa, "rag": rag,
    "agent_multiturn": agent_multiturn, "lognormal": lognormal,
}
