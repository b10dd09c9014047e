"""The config reference (docs/config.md), generated from the config schema's own source.

  python -m pdjax.config --markdown > docs/config.md

The schema is the embedded default config, pdjax/configs/default.py `get_config()` (its
`workload` section is built by pdjax/workload/loader.py `default_workload_config()`). Every
key's description is the trailing `# ...` comment of the line that assigns it, read with ast
and tokenize, so the reference cannot drift from the code. Comment conventions:
  - comment-only lines aligned under a trailing comment continue it;
  - a trailing comment indented past its `#` (`#   more`) continues the comment of the key on
    the line above, and both keys share the whole text (`a = 1  # x | y |` / `b = 2  #   z`);
  - keys set in a `ConfigDict(dict(name=...))` literal are described by comment lines
    `# name: text` right under the run of such literals (or trailing on the literal's line);
  - a variant (`if arg == "smoke":  # text`) is described by the comment on its test line.
Defaults are the values `get_config()` returns; variants list the keys they change.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import io
import json
import re
import sys
import textwrap
import tokenize

SCHEMA_MODULE = "pdjax.configs.default"
COMMAND = "python -m pdjax.config --markdown > docs/config.md"
GLOSSARY = re.compile(r"^\s*(\w+):\s+(.*)$")
TOP_LEVEL = "Top level"


def _comments(source: str) -> dict[int, tuple[int, str, bool]]:
  """line -> (column of '#', text after '#', whether the line holds only the comment)."""
  lines = source.splitlines()
  out = {}
  for token in tokenize.generate_tokens(io.StringIO(source).readline):
    if token.type == tokenize.COMMENT:
      row, col = token.start
      out[row] = (col, token.string[1:].rstrip(), not lines[row - 1][:col].strip())
  return out


def _join(pieces: list[str]) -> str:
  text = ""
  for piece in (p.strip() for p in pieces):
    glued = text.endswith("|") and not text.endswith(" |")   # a|b|\n c -> a|b|c
    text += piece if not text or glued else " " + piece
  return text


def _dotted(node: ast.AST, root: str) -> list[str] | None:
  """`c.kv.page_size` -> ["kv", "page_size"] when the chain starts at the name root."""
  parts = []
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  return parts[::-1] if isinstance(node, ast.Name) and node.id == root and parts else None


def _call_name(node: ast.AST) -> str:
  func = node.func if isinstance(node, ast.Call) else None
  return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _function(func) -> tuple[ast.FunctionDef, dict]:
  """The ast of a module-level function and its file's comments."""
  source = inspect.getsource(inspect.getmodule(func))
  tree = ast.parse(source)
  node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == func.__name__)
  return node, _comments(source)


class _Reader:
  """Walks one builder function's top-level assignments into `described` (dotted key ->
  description, source order) and `sections` (dotted section names)."""

  def __init__(self, described: dict[str, str], sections: dict[str, str]):
    self.described, self.sections = described, sections

  def read(self, func, prefix: tuple[str, ...] = ()) -> ast.FunctionDef:
    node, self.comments = _function(func)
    returned = [s.value for s in node.body if isinstance(s, ast.Return)]
    root = returned[-1].id if returned and isinstance(returned[-1], ast.Name) else "c"
    self.literal_lines = {s.lineno: s.end_lineno for s in node.body
                          if isinstance(s, ast.Assign) and self._dict_literal(s.value) is not None}
    owner: dict[str, list[str]] = {}   # key -> its comment's pieces (shared by a group)
    group, last_line = None, -1   # the newest comment and the line it ends on
    for stmt in node.body:
      if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
        continue
      parts = _dotted(stmt.targets[0], root)
      if parts is None:
        continue
      key = ".".join(prefix + tuple(parts))
      value, literal = stmt.value, self._dict_literal(stmt.value)
      if _call_name(value) == "ConfigDict" or literal is not None:
        self.sections.setdefault(key, "")
        for name in literal or ():
          self.described.setdefault(f"{key}.{name}", "")
        self._glossary(stmt, key, literal or ())
      elif isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
        self.sections.setdefault(key, "")   # a section built by a function of its own
        _Reader(self.described, self.sections).read(
            inspect.getmodule(func).__dict__[value.func.id], prefix + tuple(parts))
      else:
        self.described.setdefault(key, "")
      found = self._trailing(stmt)
      if found is None:
        continue
      line, col, text = found
      if text.startswith("  ") and group and last_line == line - 1:
        group.append(text)   # continues the comment of the key above
      elif literal is not None and GLOSSARY.match(text) and GLOSSARY.match(text)[1] in literal:
        continue   # described the literal's keys
      else:
        group = [text]
      while (line + 1 in self.comments and self.comments[line + 1][2]
             and self.comments[line + 1][0] == col):
        line += 1
        group.append(self.comments[line][1])
      owner[key], last_line = group, line
    for key, group in owner.items():
      (self.sections if key in self.sections else self.described)[key] = _join(group)
    return node

  @staticmethod
  def _dict_literal(value: ast.AST) -> tuple[str, ...] | None:
    """ConfigDict(dict(a=1, b=2)) -> ("a", "b"); None for anything else."""
    if _call_name(value) == "ConfigDict" and len(value.args) == 1:
      inner = value.args[0]
      if _call_name(inner) == "dict" and not inner.args:
        return tuple(k.arg for k in inner.keywords)
    return None

  def _trailing(self, stmt: ast.stmt):
    for line in range(stmt.lineno, stmt.end_lineno + 1):
      if line in self.comments and not self.comments[line][2]:
        col, text, _ = self.comments[line]
        return line, col, text
    return None

  def _glossary(self, stmt: ast.stmt, key: str, names: tuple[str, ...]) -> None:
    """Describes a literal's keys from `# name: text` comments (and their `#   more`
    continuations): trailing on its line or on the lines under its run of literals."""
    glossary, current = {}, None
    found = self._trailing(stmt)
    if found and GLOSSARY.match(found[2]):
      current, text = GLOSSARY.match(found[2]).groups()
      glossary[current] = [text]
    line = stmt.end_lineno + 1
    while True:
      if line in self.literal_lines:
        line = self.literal_lines[line] + 1
        continue
      comment = self.comments.get(line)
      if not comment or not comment[2]:
        break
      match = GLOSSARY.match(comment[1])
      if match:
        current = match.group(1)
        glossary[current] = [match.group(2)]
      elif comment[1].startswith("  ") and current:
        glossary[current].append(comment[1])
      else:
        break
      line += 1
    for name in names:
      if name in glossary:
        self.described[f"{key}.{name}"] = _join(glossary[name])


def leaves(cfg, prefix: str = "") -> dict[str, object]:
  """Every non-section key of a ConfigDict, dotted -> value."""
  import ml_collections
  out = {}
  for key in cfg.keys():
    value = cfg[key]
    if isinstance(value, ml_collections.ConfigDict):
      out.update(leaves(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def _variants(node: ast.FunctionDef, comments: dict) -> dict[str, str]:
  """Variant name -> the comment on its `if arg == "name":` line ("" without one)."""
  arg = node.args.args[0].arg if node.args.args else None
  out = {}
  for test in (n.test for n in ast.walk(node) if isinstance(n, ast.If)):
    if (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
        and test.left.id == arg and isinstance(test.ops[0], ast.Eq)
        and isinstance(test.comparators[0], ast.Constant)
        and isinstance(test.comparators[0].value, str)):
      comment = comments.get(test.lineno)
      out[test.comparators[0].value] = comment[1].strip() if comment and not comment[2] else ""
  return out


def schema(module: str = SCHEMA_MODULE) -> tuple[dict, dict, dict, object]:
  """(key -> description, section -> description, variant -> description, get_config) of the
  module's get_config(), keys and sections in source order."""
  get_config = importlib.import_module(module).get_config
  described, sections = {}, {}
  reader = _Reader(described, sections)
  node = reader.read(get_config)
  return described, sections, _variants(node, reader.comments), get_config


def _code(value) -> str:
  if isinstance(value, str):
    text = json.dumps(value, ensure_ascii=False)
  elif isinstance(value, (tuple, list)):
    text = "(" + ", ".join(_code(v).strip("`") for v in value) + ("," * (len(value) == 1)) + ")"
  else:
    text = repr(value)
  return "`" + text.replace("|", "\\|") + "`"


def _cell(text: str) -> str:
  return re.sub(r"<(?=\w)", "&lt;", text.replace("|", "\\|").replace("*", "\\*"))


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
  lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
  return lines + ["| " + " | ".join(row) + " |" for row in rows] + [""]


def markdown(module: str = SCHEMA_MODULE) -> str:
  """docs/config.md: every key by section, with its default and description; the variants."""
  described, sections, variants, get_config = schema(module)
  values = leaves(get_config())
  order = [k for k in described if k in values] + [k for k in values if k not in described]
  by_section: dict[str, list[str]] = {TOP_LEVEL: []}
  for key in order:
    head = key.split(".")[0]
    by_section.setdefault(head if head in sections else TOP_LEVEL, []).append(key)
  out = ["# Config reference", "",
         "<!-- Generated from the comments in pdjax/configs/default.py and",
         "pdjax/workload/loader.py: edit those, then regenerate this file with",
         f"{COMMAND} -->", "",
         textwrap.fill(
             "Every key of the default config (pdjax/configs/default.py `get_config()`; the "
             "`workload` section is pdjax/workload/loader.py `default_workload_config()`): its "
             "default and its description, taken from the comments in that source. Override a "
             "key on the command line with `--config.<key>=<value>`, e.g. "
             "`python -m pdjax.run --config.workload.rate=4`.", width=96), ""]
  for section, keys in by_section.items():
    if not keys:
      continue
    out += [f"## {section}" if section == TOP_LEVEL else f"## `{section}`", ""]
    if sections.get(section):
      out += [_cell(sections[section]), ""]
    out += _table(("Key", "Default", "Description"),
                  [(f"`{k}`", _code(values[k]), _cell(described.get(k, ""))) for k in keys])
  if variants:
    out += ["## Variants", "",
            "A variant follows the config file's path, e.g. "
            "`--config=configs/default.py:smoke`;", "it changes these keys:", ""]
  for name, description in variants.items():
    changed = leaves(get_config(name))
    out += [f"### `:{name}`", ""] + ([_cell(description), ""] if description else [])
    out += _table(("Key", "Default", f"`:{name}`"),
                  [(f"`{k}`", _code(values.get(k)), _code(changed[k]))
                   for k in order + [k for k in changed if k not in values]
                   if k in changed and values.get(k) != changed[k]])
  return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str]) -> int:
  """python -m pdjax.config --markdown: the reference on stdout (utf-8)."""
  if argv and argv[0] in ("-h", "--help", "--helpfull"):
    print(__doc__)
    return 0
  if argv != ["--markdown"]:
    print(f"usage: {COMMAND}", file=sys.stderr)
    return 2
  sys.stdout.buffer.write(markdown().encode("utf-8"))
  return 0
