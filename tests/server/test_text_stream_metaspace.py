"""A SentencePiece-style (Metaspace) tokenizer drops a word's leading space when the word
starts the decoded text: the stream decodes its first token after the prompt's last tokens, so
"Hello" answered with "▁world" streams " world", not "world" (issue 25)."""

import tokenizers
from tokenizers import decoders, models, pre_tokenizers

from pdjax.server.text_stream import CONTEXT_TOKENS, TextStream


class Metaspace:
  """A word-level tokenizer with SentencePiece's Metaspace pre-tokenizer and decoder, built
  locally (no download)."""

  def __init__(self):
    vocab = {"[UNK]": 0, "▁Hello": 1, "▁world": 2, "▁again": 3, "!": 4}
    self.tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    self.tok.pre_tokenizer = pre_tokenizers.Metaspace()
    self.tok.decoder = decoders.Metaspace()

  def encode(self, text):
    return self.tok.encode(text).ids

  def decode(self, ids):
    return self.tok.decode(list(ids))


def test_metaspace_decoder_drops_the_space_of_a_text_start():
  tok = Metaspace()
  assert tok.encode("Hello world") == [1, 2]
  assert tok.decode([2]) == "world" and tok.decode([1, 2]) == "Hello world"


def test_the_first_generated_word_keeps_its_space_after_the_prompt():
  tok = Metaspace()
  prompt = tok.encode("Hello")
  stream = TextStream(tok, context=prompt[-CONTEXT_TOKENS:])
  out = [stream.add(t) for t in (2, 3, 4)] + [stream.finish()]
  assert "".join(out) == " world again!"
  bare = TextStream(tok)       # without the prompt's tokens: the space is lost
  assert "".join([bare.add(t) for t in (2, 3, 4)] + [bare.finish()]) == "world again!"
