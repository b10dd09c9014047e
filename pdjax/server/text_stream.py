"""A request's generated text, a piece per token, with stop strings. Pure Python.

Incremental detokenization: decoding every token alone breaks words and multi-byte characters
apart, decoding the whole output every token costs O(n) a token. So, as vLLM does, only a
short window is decoded: the text of tokens [prefix, read) is known; the text of [prefix, end)
minus it is the new piece, emitted once it does not end in an unfinished character (U+FFFD)
and then the window moves on. Stop strings (OpenAI `stop`): the text is held back by the
longest stop's length - 1 characters so that a stop split across tokens is never half sent;
when one appears, the text before it is the answer's end and the request stops there (the
stop itself is not returned). EOS tokens (the model's stop ids) add no text.
"""

from __future__ import annotations

CONTEXT_TOKENS = 5   # prompt tokens decoded before the first generated one (as vLLM does)


class TextStream:

  def __init__(self, tokenizer, stops: tuple[str, ...] = (), eos_ids: tuple[int, ...] = (),
               context: tuple[int, ...] | list[int] = ()):
    """context: the prompt's last token ids (CONTEXT_TOKENS of them). The first window is
    decoded after them, so a decoder that drops a word's leading space at the start of a text
    (SentencePiece's Metaspace: "▁world" alone reads "world") keeps it: " world"."""
    self.tokenizer, self.stops, self.eos_ids = tokenizer, tuple(stops), set(eos_ids)
    self.ids: list[int] = [int(t) for t in context]
    self.text = ""            # decoded so far (may run ahead of what was sent)
    self.sent = 0             # characters of `text` handed out
    self.stopped = False      # a stop string was found: `text` ends before it
    self._prefix, self._read = 0, len(self.ids)
    self._hold = max((len(s) for s in self.stops), default=1) - 1

  def add(self, token: int) -> str:
    """Takes one generated token; returns the text that may be sent now ("" if none)."""
    if self.stopped or token in self.eos_ids:
      return ""
    self.ids.append(int(token))
    self._decode(final=False)
    if self._find_stop():
      return self._take(len(self.text))
    return self._take(len(self.text) - self._hold)

  def finish(self) -> str:
    """The rest of the text once the request ended (held-back characters and a last
    unfinished character included)."""
    if not self.stopped:
      self._decode(final=True)
      self._find_stop()
    return self._take(len(self.text))

  def _decode(self, final: bool) -> None:
    if self._read == len(self.ids):
      return
    known = self.tokenizer.decode(self.ids[self._prefix:self._read])
    window = self.tokenizer.decode(self.ids[self._prefix:])
    if len(window) > len(known) and (final or not window.endswith("\ufffd")):
      self.text += window[len(known):]
      self._prefix, self._read = self._read, len(self.ids)

  def _find_stop(self) -> bool:
    if not self.stops:
      return False
    start = max(self.sent - self._hold, 0)
    at = min((i for i in (self.text.find(s, start) for s in self.stops) if i >= 0), default=-1)
    if at >= 0:
      self.text, self.stopped = self.text[:at], True
    return self.stopped

  def _take(self, upto: int) -> str:
    if upto <= self.sent:
      return ""
    piece, self.sent = self.text[self.sent:upto], upto
    return piece
