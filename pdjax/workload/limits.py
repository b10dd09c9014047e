"""Fitting requests into the model's context: the one truncation rule for every source.

The engine rejects a request whose prompt_len + max_new_tokens exceeds max_model_len; a trace
row or preset that does not fit is truncated here instead, and counted, so a replay keeps its
arrival pattern. Rule: max_new_tokens is cut to at most max_model_len - 1 (one prompt token
must remain), then the prompt keeps its first max_model_len - max_new_tokens tokens (prefixes,
and so prefix sharing, survive).
"""

from __future__ import annotations


def check_max_model_len(max_model_len: int) -> None:
  if max_model_len < 2:
    raise ValueError(f"max_model_len must be >= 2 (one prompt and one output token), "
                     f"got {max_model_len}")


def fit_lengths(prompt_len: int, output_len: int, max_model_len: int) -> tuple[int, int]:
  """(prompt_len, output_len) cut so that their sum is at most max_model_len."""
  output_len = min(output_len, max_model_len - 1)
  return min(prompt_len, max_model_len - output_len), output_len


def truncation_note(source: str, truncated: int, total: int, max_model_len: int) -> str:
  """The problems line for truncated requests."""
  return (f"{source}: truncated {truncated} of {total} requests to fit max_model_len="
          f"{max_model_len} (max_new_tokens <= {max_model_len - 1}, prompt keeps its first "
          f"max_model_len - max_new_tokens tokens)")
