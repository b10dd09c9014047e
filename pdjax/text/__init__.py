"""Text in, text out: a checkpoint folder's tokenizer, chat template and stop tokens.

Host logic (no jax): `tokenizer.Tokenizer` wraps `tokenizers` with the folder's special tokens,
`chat` renders its chat template as transformers does, `stops` reads the EOS ids generation
stops at, `prompts` turns `pdjax.generate` input lines into token ids, `errors.TextError` is
what they raise, and `gguf` makes an ordinary Hugging Face folder out of a GGUF file (SmolLM2,
offline; the command is `python -m pdjax.from_gguf`).
"""

from pdjax.text.tokenizer import TextError, Tokenizer  # noqa: F401  (re-exports)
