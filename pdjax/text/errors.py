"""TextError, the one error of pdjax.text: bad text input, tokenizer files or chat template.

Its own module so that every text module raises it without importing another's insides
(pdjax.text.tokenizer re-exports it, where callers have always imported it from).
"""


class TextError(ValueError):
  """Bad text input or tokenizer files; str() is the one line shown to the user."""
