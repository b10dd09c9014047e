"""Turns a Llama GGUF file into an ordinary Hugging Face folder pdjax can load, offline.

The old path of the `pdjax.from_gguf` command, kept so that `python -m pdjax.text.from_gguf`
still works: this module only runs that command (the conversion is pdjax/text/gguf.py's).
"""

if __name__ == "__main__":
  from pdjax.from_gguf import entry_point
  entry_point()
