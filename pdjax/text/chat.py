"""Chat templates: where a folder keeps one, and rendering it the way transformers'
`apply_chat_template` does (sandboxed jinja2, trim_blocks + lstrip_blocks, loop controls,
`raise_exception`, `strftime_now`, a non-escaping `tojson`, `{% generation %}` blocks)."""

from __future__ import annotations

import datetime
import json
import os

from pdjax.text.errors import TextError


def find_template(folder: str, config: dict) -> str | None:
  """chat_template.jinja, else chat_template.json, else tokenizer_config.json's
  `chat_template` (a string, or named templates: "default"); None when the folder has none."""
  path = os.path.join(folder, "chat_template.jinja")
  if os.path.isfile(path):
    with open(path) as f:
      return f.read()
  template = config.get("chat_template")
  path = os.path.join(folder, "chat_template.json")
  if os.path.isfile(path):
    with open(path) as f:
      template = json.load(f).get("chat_template", template)
  if isinstance(template, list):
    named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
    template = named.get("default")
  return template if isinstance(template, str) and template else None


def _environment():
  import jinja2
  from jinja2 import ext, nodes
  from jinja2.sandbox import ImmutableSandboxedEnvironment

  class Generation(ext.Extension):
    """`{% generation %}...{% endgeneration %}` (assistant-mask markers): renders the body."""
    tags = {"generation"}

    def parse(self, parser):
      lineno = next(parser.stream).lineno
      body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
      return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
      return caller()

  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)

  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                      extensions=[Generation, ext.loopcontrols])
  env.filters["tojson"] = tojson
  env.globals["raise_exception"] = raise_exception
  env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
  return env


_COMPILED: dict[str, object] = {}


def render(template: str, messages: list[dict], special_tokens: dict,
           add_generation_prompt: bool = True) -> str:
  """The rendered chat; a template that fails raises TextError with its message."""
  import jinja2
  try:
    if template not in _COMPILED:
      _COMPILED[template] = _environment().from_string(template)
    return _COMPILED[template].render(messages=messages, tools=None, documents=None,
                                      add_generation_prompt=add_generation_prompt,
                                      **special_tokens)
  except jinja2.TemplateError as e:
    raise TextError(f"chat template: {' '.join(str(e).split())}") from None
