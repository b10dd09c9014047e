"""The token ids generation stops at: generation_config.json's `eos_token_id` (an id or a list),
else config.json's, else the tokenizer's EOS token (what transformers' `generate` uses); and
`load_text`, a checkpoint's tokenizer with its stop ids (pdjax.generate, pdjax.serve)."""

from __future__ import annotations

import os

from pdjax.text.tokenizer import TextError, read_json


def _ids(value) -> tuple[int, ...] | None:
  if value is None:
    return None
  values = value if isinstance(value, list) else [value]
  if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
    raise ValueError(value)
  return tuple(values)


def stop_token_ids(folder: str, config_eos: tuple[int, ...] = (), tokenizer=None,
                   vocab_size: int | None = None) -> tuple[int, ...]:
  """Stop ids for the checkpoint in folder; config_eos: config.json's (LlamaConfig's)."""
  path = os.path.join(folder, "generation_config.json") if folder else ""
  try:
    ids = _ids(read_json(path).get("eos_token_id")) if path else None
  except ValueError as e:
    raise TextError(f"{path}: eos_token_id={e} is not a token id or a list of them") from None
  if ids is None:
    ids, path = tuple(config_eos), os.path.join(folder, "config.json")
  if not ids and tokenizer is not None:
    eos = tokenizer.special_tokens.get("eos_token")
    found = tokenizer.token_id(eos) if eos else None
    ids, path = ((found,) if found is not None else ()), os.path.join(folder, "tokenizer.json")
  if vocab_size is not None:
    bad = [i for i in ids if i >= vocab_size]
    if bad:
      raise TextError(f"{path}: stop token {bad[0]} is outside the vocabulary "
                      f"[0, {vocab_size})")
  return tuple(ids)


def load_text(checkpoint: str, tokenizer_dir: str, mcfg):
  """(tokenizer or None, why there is none, stop ids). Raises TextError for a tokenizer that
  does not fit the checkpoint (vocabulary, stop ids)."""
  from pdjax.text.tokenizer import Tokenizer, has_tokenizer
  folder = tokenizer_dir or checkpoint
  tokenizer, why = None, f"no tokenizer.json in {folder} (pass --tokenizer)"
  if tokenizer_dir or has_tokenizer(folder):
    tokenizer = Tokenizer(folder)
    if tokenizer.vocab_size > mcfg.vocab_size:
      raise TextError(f"{folder}/tokenizer.json: token ids up to {tokenizer.vocab_size - 1} do "
                      f"not fit the checkpoint's vocab_size={mcfg.vocab_size} "
                      f"({checkpoint}/config.json)")
  stop_ids = stop_token_ids(checkpoint, mcfg.eos_token_ids, tokenizer, mcfg.vocab_size)
  return tokenizer, why, stop_ids
