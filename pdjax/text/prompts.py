"""`pdjax.generate` input lines -> token ids, with what is wrong with each.

A line is {"id": ..., one of "prompt_ids" (token ids), "prompt" (text, encoded with the
tokenizer's special tokens) or "messages" (a chat, [{"role", "content"}, ...], rendered with the
folder's chat template plus the assistant prompt), optional "seed"}. A malformed line (bad JSON,
wrong types, ids outside the vocabulary, a repeated id) fails the whole file, naming file:line.
A well-formed request that cannot be served (an empty prompt, no tokenizer or chat template,
longer than the context) gets `error`, one line, and the others are served. Pure Python.
"""

from __future__ import annotations

import dataclasses
import json

from pdjax.text.tokenizer import TextError

FIELDS = ("prompt_ids", "prompt", "messages")


@dataclasses.dataclass
class Prompt:
  id: str
  ids: list[int]
  seed: int | None = None
  error: str = ""              # why it is not served; "" = serve it


def _is_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def _check_line(row, vocab_size: int) -> None:
  """Raises ValueError / TypeError / KeyError for a malformed row."""
  if not isinstance(row, dict):
    raise TypeError("a line must be a JSON object")
  row["id"]  # KeyError names it
  given = [k for k in FIELDS if k in row]
  if len(given) != 1:
    raise ValueError("a line needs exactly one of prompt_ids, prompt, messages")
  ids, text, messages = row.get("prompt_ids"), row.get("prompt"), row.get("messages")
  if "prompt_ids" in row and not (isinstance(ids, list) and
                                  all(_is_int(t) and 0 <= t < vocab_size for t in ids)):
    raise ValueError(f"prompt_ids must be a non-empty list of ints in [0, {vocab_size})")
  if "prompt" in row and not isinstance(text, str):
    raise ValueError("prompt must be a string")
  if "messages" in row and not (isinstance(messages, list) and all(
      isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
      for m in messages)):
    raise ValueError('messages must be a list of {"role": str, "content": str}')
  seed = row.get("seed")
  if seed is not None and not _is_int(seed):
    raise ValueError(f"seed must be an integer, got {seed!r}")


def _tokenize(row, tokenizer, no_tokenizer: str) -> list[int]:
  if "prompt_ids" in row:
    return list(row["prompt_ids"])
  text = row.get("prompt", row.get("messages"))
  if not text:
    return []
  if tokenizer is None:
    raise TextError(f"text needs a tokenizer: {no_tokenizer}")
  return tokenizer.encode(text) if "prompt" in row else tokenizer.encode_chat(text)


def read_prompts(path: str, vocab_size: int, *, tokenizer=None, no_tokenizer: str = "",
                 context: int | None = None, max_new_tokens: int = 0) -> list[Prompt]:
  """One Prompt per non-empty line, in file order. tokenizer: a Tokenizer, or None (then
  `no_tokenizer` says why text lines cannot be served); context: the most tokens a request may
  hold, prompt + max_new_tokens. Raises ValueError "path:line: ..." for a malformed line."""
  prompts, seen = [], {}
  with open(path) as f:
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
        _check_line(row, vocab_size)
        rid = str(row["id"])
        if rid in seen:
          raise ValueError(f"id {rid!r} repeats line {seen[rid]}")
        seen[rid] = lineno
      except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}:{lineno}: {type(e).__name__}: {e}") from None
      prompt = Prompt(rid, [], row.get("seed"))
      try:
        prompt.ids = _tokenize(row, tokenizer, no_tokenizer)
        if not prompt.ids:
          raise TextError("empty prompt")
        bad = [t for t in prompt.ids if t >= vocab_size]
        if bad:
          raise TextError(f"token {bad[0]} is outside the checkpoint's vocabulary "
                          f"[0, {vocab_size})")
        if context is not None and len(prompt.ids) + max_new_tokens > context:
          raise TextError(f"prompt of {len(prompt.ids)} tokens + max_new_tokens="
                          f"{max_new_tokens} exceeds the context of {context} tokens")
      except TextError as e:
        prompt.error = str(e)
      prompts.append(prompt)
  return prompts
