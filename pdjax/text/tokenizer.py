"""A checkpoint folder's tokenizer: tokenizer.json through `tokenizers`, with the special tokens
and the chat template of tokenizer_config.json (what transformers' AutoTokenizer reads).

Encoding a plain prompt applies tokenizer.json's post-processor (a BOS where the folder says
so); a chat is rendered with its template and encoded without adding special tokens, as
`apply_chat_template` does. Decoding skips special tokens. Pure Python, no jax.
"""

from __future__ import annotations

import json
import os

from pdjax.text import chat as chat_lib
from pdjax.text.errors import TextError   # (callers import it from here too)

SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                 "mask_token")
# transformers' clean_up_tokenization (WordPiece-era spacing fixes; never applied to BPE).
_CLEANUP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
            (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def read_json(path: str) -> dict:
  """The JSON object in path, {} when the file does not exist."""
  if not os.path.isfile(path):
    return {}
  try:
    with open(path) as f:
      data = json.load(f)
  except (OSError, ValueError) as e:
    raise TextError(f"{path}: not valid JSON ({e})") from None
  if not isinstance(data, dict):
    raise TextError(f"{path}: not a JSON object")
  return data


def has_tokenizer(folder: str) -> bool:
  return bool(folder) and os.path.isfile(os.path.join(folder, "tokenizer.json"))


def vocab_size_of(folder: str) -> int:
  """Highest token id + 1 in folder/tokenizer.json, read as JSON (no `tokenizers` needed)."""
  path = os.path.join(folder, "tokenizer.json")
  data = read_json(path)
  vocab = (data.get("model") or {}).get("vocab")
  ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab or ())))
  ids += [t.get("id", -1) for t in data.get("added_tokens") or ()]
  if not ids:
    raise TextError(f"{path}: no vocabulary")
  return max(ids) + 1


def _content(value) -> str | None:
  """A special token as tokenizer_config.json stores it: a string or {"content": ...}."""
  if isinstance(value, dict):
    value = value.get("content")
  return value if isinstance(value, str) else None


class Tokenizer:
  """encode / decode / encode_chat for one folder; vocab_size is the highest id + 1."""

  def __init__(self, folder: str):
    path = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(path):
      raise TextError(f"{folder}: no tokenizer.json")
    try:
      import tokenizers
    except ImportError:
      raise TextError("text prompts need the tokenizers package: pip install tokenizers") from None
    try:
      self._tok = tokenizers.Tokenizer.from_file(path)
    except Exception as e:  # the Rust library raises plain Exception for a bad file
      raise TextError(f"{path}: cannot load ({str(e).splitlines()[0]})") from None
    self.folder = folder
    config = {**read_json(os.path.join(folder, "special_tokens_map.json")),
              **read_json(os.path.join(folder, "tokenizer_config.json"))}
    self.special_tokens = {name: _content(config.get(name)) for name in SPECIAL_NAMES
                           if _content(config.get(name)) is not None}
    extra = [_content(t) for t in config.get("additional_special_tokens") or ()]
    if extra:
      self.special_tokens["additional_special_tokens"] = [t for t in extra if t]
    self.chat_template = chat_lib.find_template(folder, config)
    self._cleanup = (bool(config.get("clean_up_tokenization_spaces", False))
                     and type(self._tok.model).__name__ != "BPE")
    vocab = self._tok.get_vocab(with_added_tokens=True)
    self.vocab_size = max(vocab.values()) + 1
    self.vocab_strings = tuple(vocab)   # the entries' texts (the server's prompt-size bound)

  def token_id(self, token: str) -> int | None:
    return self._tok.token_to_id(token)

  def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
    return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

  def decode(self, ids, skip_special_tokens: bool = True) -> str:
    text = self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)
    if self._cleanup:
      for a, b in _CLEANUP:
        text = text.replace(a, b)
    return text

  def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """The chat as the model sees it (raises TextError without a template)."""
    if self.chat_template is None:
      raise TextError(f"messages need a chat template; {self.folder} has none")
    return chat_lib.render(self.chat_template, messages, self.special_tokens,
                           add_generation_prompt=add_generation_prompt)

  def encode_chat(self, messages: list[dict]) -> list[int]:
    return self.encode(self.render_chat(messages), add_special_tokens=False)
