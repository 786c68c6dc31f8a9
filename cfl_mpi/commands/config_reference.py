"""The configuration reference, docs/CONFIG.md, generated from the typed config.

    python -m cfl_mpi.commands.config_reference --write     # rewrite docs/CONFIG.md
    python -m cfl_mpi.commands.config_reference > FILE      # or print it
    python -m cfl_mpi.commands.config_reference --check     # exit 1 if docs/CONFIG.md is out of date

The dataclasses of `cfl_mpi/config/` and of the strategies (`cfl_mpi/strategies/`) are
the single source: every key, its type, default
and allowed values (`Literal` arguments) come from the classes, and its meaning from the
comment beside the field in the source, so the reference cannot drift from the code
(tests/test_config_reference.py fails while docs/CONFIG.md differs from `render()`).

Where a field's meaning is read from (the convention those modules follow):
- the block of comment lines directly above the field, and a comment at the end of its line;
- a field with neither shares the block of the field right above it (no blank line between)
  when that block names it, e.g. `norm_ratio` under the block of `outliers` that mentions
  it. A block that does not name the next field does not explain it: a field added below
  another without a comment shows up as unexplained instead of borrowing a wrong meaning.
A section (a nested dataclass) is introduced by its class docstring, else by the comment
block above the class, and then by the comment on the field that holds it (its own comment
only: a section never shares the block of the field above it).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import json
import re
import sys
import tokenize
import types
import typing
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal, Union

from ..config import Config, yaml_hints
from ..data import REGISTRY as DATA_SETS
from ..data import DataConfig
from ..strategies import REGISTRY, StrategyConfig

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CONFIG_MD = PROJECT_ROOT / "docs" / "CONFIG.md"
COMMAND = "python -m cfl_mpi.commands.config_reference --write"
MISSING_TEXT = "**No explanation yet**: add a comment above this field in its class's source."


@dataclass(frozen=True)
class Key:
    """One row of the reference: a leaf key as `--set` takes it."""

    key: str
    type: str
    default: str
    allowed: str
    meaning: str | None  # None: its source has no comment for it


@dataclass(frozen=True)
class Section:
    """One table: the keys of one nested dataclass (or the top level, or one strategy)."""

    title: str
    intro: str
    keys: list[Key]


# --------------------------------------------------------------------------- comments


@dataclass(frozen=True)
class _Source:
    """A module's text, parsed once: comments per line and the class definitions."""

    lines: list[str]
    comments: dict[int, str]  # line number -> comment text without '#'
    classes: dict[str, ast.ClassDef]

    def comment_only(self, line: int) -> bool:
        return line in self.comments and self.lines[line - 1].lstrip().startswith("#")

    def block_above(self, line: int) -> str:
        """The comment lines directly above `line`, joined into one paragraph."""
        block: list[str] = []
        while line > 1 and self.comment_only(line - 1):
            line -= 1
            block.insert(0, self.comments[line])
        return " ".join(t for t in block if t)


def parse_source(text: str) -> _Source:
    """Comments by line (by tokenize, so a '#' inside a string is no comment) and classes (by ast)."""
    comments = {
        tok.start[0]: tok.string[1:].strip()
        for tok in tokenize.generate_tokens(io.StringIO(text).readline)
        if tok.type == tokenize.COMMENT
    }
    classes = {node.name: node for node in ast.parse(text).body if isinstance(node, ast.ClassDef)}
    return _Source(text.splitlines(), comments, classes)


@cache
def _source(module: str) -> _Source:
    """The source of the module that defines a section's class (config.py, or a strategy's module)."""
    return parse_source(inspect.getsource(sys.modules[module]))


@dataclass(frozen=True)
class Meaning:
    """A field's explanation: its own comment, or the field whose comment block it shares."""

    text: str | None = None
    shared_with: str | None = None

    def render(self, prefix: str) -> str | None:
        """The table cell: a shared block is shown once, at the field that owns it."""
        return self.text or (f"See `{prefix}{self.shared_with}`." if self.shared_with else None)


@cache
def field_meanings(cls: type) -> dict[str, Meaning]:
    """Each field of a config dataclass with its explanation, the fields it inherits explained
    where their class declares them."""
    meanings: dict[str, Meaning] = {}
    for base in reversed(cls.__mro__):
        if dataclasses.is_dataclass(base) and base.__name__ in _source(base.__module__).classes:
            meanings |= {
                k: m
                for k, m in meanings_in(_source(base.__module__), base.__name__).items()
                if m.text or m.shared_with or k not in meanings
            }
    return meanings


def meanings_in(src: _Source, class_name: str) -> dict[str, Meaning]:
    """Each field's explanation from the comments beside it (the rule: module docstring)."""
    owner: dict[str, tuple[str, str]] = {}  # field -> (field whose block explains it, block text)
    meanings: dict[str, Meaning] = {}
    previous = ""  # the field on the line right above, if any
    end = -1
    for node in src.classes[class_name].body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        name = node.target.id
        inline = [
            src.comments[n]
            for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)
            if n in src.comments and not src.comment_only(n)
        ]
        own = " ".join(t for t in [src.block_above(node.lineno), *inline] if t)
        if own:
            owner[name] = (name, own)
            meanings[name] = Meaning(text=own)
        elif end == node.lineno - 1 and previous in owner and re.search(rf"\b{re.escape(name)}\b", owner[previous][1]):
            owner[name] = owner[previous]
            meanings[name] = Meaning(shared_with=owner[name][0])
        else:
            meanings[name] = Meaning()
        previous, end = name, node.end_lineno or node.lineno
    return meanings


def class_intro(cls: type) -> str:
    """A section's introduction: the class docstring, else the comment block above the class."""
    src = _source(cls.__module__)
    node = src.classes[cls.__name__]
    doc = ast.get_docstring(node)
    if doc:
        return " ".join(doc.split())
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return src.block_above(first)


# --------------------------------------------------------------------------- types and values


def _is_section(tp: Any) -> bool:
    """A nested mapping of keys: a dataclass, or the strategy's section (its class by name)."""
    return isinstance(tp, type) and (dataclasses.is_dataclass(tp) or issubclass(tp, (StrategyConfig, DataConfig)))


def _args(tp: Any) -> tuple[Any, ...]:
    return typing.get_args(tp) if typing.get_origin(tp) in (Union, types.UnionType) else (tp,)


def type_name(tp: Any) -> str:
    """The YAML type a key takes: int, float, bool, string, list of ..., or null."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " or ".join(dict.fromkeys(type_name(type(a)) for a in typing.get_args(tp)))
    if origin in (Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"list of {type_name(typing.get_args(tp)[0])}"
    return {int: "int", float: "float", bool: "bool", str: "string", type(None): "null"}.get(tp, tp.__name__)


def allowed_values(tp: Any) -> str:
    """The values a `Literal` key (optionally null) accepts; empty for a free value."""
    literals = [a for arg in _args(tp) if typing.get_origin(arg) is Literal for a in typing.get_args(arg)]
    if not literals:
        return ""
    if type(None) in _args(tp):
        literals.append(None)
    return ", ".join(f"`{_yaml(v)}`" for v in literals)


def _yaml(value: Any) -> str:
    """A value as it is written in YAML or after `--set key=`."""
    if isinstance(value, str):
        return value if value else '""'
    return json.dumps(value)


def _default(f: dataclasses.Field) -> str:
    """The default as written in YAML; a field without one must be given ("required")."""
    if f.default is not dataclasses.MISSING:
        return f"`{_yaml(f.default)}`"
    if f.default_factory is not dataclasses.MISSING:
        return f"`{_yaml(f.default_factory())}`"
    return "required"


# --------------------------------------------------------------------------- the walk


def _keys(cls: type, prefix: str, skip: tuple[str, ...] = ()) -> list[Key]:
    """The leaf keys of `cls` (nested sections are left to `sections`)."""
    hints = yaml_hints(cls)
    meanings = field_meanings(cls)
    rows = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if f.name in skip or any(_is_section(a) for a in _args(tp)) or _list_of_sections(tp):
            continue
        rows.append(
            Key(prefix + f.name, type_name(tp), _default(f), allowed_values(tp), meanings[f.name].render(prefix))
        )
    return rows


def _list_of_sections(tp: Any) -> type | None:
    """The entry type of a list of sections (late_silos), else None."""
    if typing.get_origin(tp) is list and _is_section(typing.get_args(tp)[0]):
        return typing.get_args(tp)[0]
    return None


def _join(*parts: str | None) -> str:
    return " ".join(p for p in parts if p)


def sections() -> list[Section]:
    """Every table of the reference: the top level, each nested section in field order (depth
    first), then one per strategy (its keys depend on `strategy.name`)."""
    top = Section("Top level", class_intro(Config), [])
    out = [top]
    strategies: list[Section] = []
    hints = yaml_hints(Config)
    meanings = {name: m.text for name, m in field_meanings(Config).items()}  # sections: own comments only
    leaves = {k.key: k for k in _keys(Config, "")}
    for f in dataclasses.fields(Config):
        tp = hints[f.name]
        if f.name == "strategy":
            top.keys.append(
                Key(
                    "strategy.name",
                    "string",
                    f"`{Config().strategy.name}`",
                    ", ".join(f"`{n}`" for n in REGISTRY),
                    meanings[f.name],
                )
            )
            for name, cls in ((name, spec.params) for name, spec in REGISTRY.items()):
                intro = _join(f"Keys of `strategy` with `strategy.name: {name}`.", class_intro(cls))
                strategies.append(Section(f"strategy.name: {name}", intro, _keys(cls, "strategy.", skip=("name",))))
        elif f.name == "data":
            kinds: dict[type, list[str]] = {}
            for name, data_set in DATA_SETS.items():
                kinds.setdefault(data_set, []).append(name)
            top.keys.append(
                Key(
                    "data.name",
                    "string",
                    f"`{Config().data.name}`",
                    ", ".join(f"`{n}`" for n in DATA_SETS),
                    meanings[f.name],
                )
            )
            for data_set, names in kinds.items():
                choice = " or ".join(f"`data.name: {n}`" for n in names)
                intro = _join(f"Keys of `data` with {choice}.", class_intro(data_set))
                out.append(Section(f"data.name: {', '.join(names)}", intro, _keys(data_set, "data.", skip=("name",))))
        elif _is_section(tp):
            out += _section_tree(tp, f.name, meanings[f.name])
        elif (item := _list_of_sections(tp)) is not None:
            example = ", ".join(f"{g.name}: ..." for g in dataclasses.fields(item))
            intro = _join(
                class_intro(item),
                meanings[f.name],
                f"A list; each entry is a mapping of the keys below: `--set '{f.name}=[{{{example}}}]'`.",
            )
            out.append(Section(f.name, intro, _keys(item, f"{f.name}[i].")))
        else:
            top.keys.append(leaves[f.name])
    return out + strategies


def _section_tree(cls: type, path: str, field_comment: str | None) -> list[Section]:
    """`cls`'s own table and, below it, those of its nested sections (e.g. runtime.fault)."""
    nested = []
    hints = yaml_hints(cls)
    meanings = {name: m.text for name, m in field_meanings(cls).items()}
    for f in dataclasses.fields(cls):
        for arg in _args(hints[f.name]):
            if _is_section(arg):
                nested += _section_tree(arg, f"{path}.{f.name}", meanings[f.name])
    return [Section(path, _join(class_intro(cls), field_comment), _keys(cls, path + "."))] + nested


def missing_explanations() -> list[str]:
    """Keys and sections that the config's sources explain nowhere (the test wants none)."""
    found = []
    for section in sections():
        if not section.intro:
            found.append(f"section {section.title}")
        found += [k.key for k in section.keys if not k.meaning]
    return found


# --------------------------------------------------------------------------- Markdown


def _text(text: str) -> str:
    """Comment text as Markdown: `<`, outside code spans, would open an HTML tag (`<root>`)."""
    parts = text.split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(parts))


def _cell(text: str) -> str:
    """A table cell: `|` would end it, even inside a code span."""
    return _text(text).replace("|", "\\|")


def _anchor(title: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def render() -> str:
    """docs/CONFIG.md's whole text."""
    all_sections = sections()
    lines = [
        "# Configuration reference",
        "",
        f"<!-- Generated by `{COMMAND}` from cfl_mpi/config/ and cfl_mpi/strategies: do not edit by hand. -->",
        "",
        f"Generated from the typed config in `cfl_mpi/config/` and `cfl_mpi/strategies/` by `{COMMAND}`; "
        "do not edit it",
        "by hand. To change it, change the dataclass fields or the comments beside them and",
        "regenerate: `tests/test_config_reference.py` fails while this file is out of date.",
        "",
        "A config is a YAML file of these keys; every key has the default shown, so a config",
        "names only what it changes. `--set key=value` sets one key on the command line, its",
        "value read as YAML (`--set strategy.noise_multiple=4`, `--set 'data.rotations=[0, 180]'`);",
        "`--set strategy.name=...` starts a fresh strategy section. An unknown key, a value of the",
        "wrong type or one outside *allowed* is an error that names the key; ranges and",
        "combinations of keys are checked when the config is loaded, also naming the key.",
        "",
        "## Contents",
        "",
    ]
    lines += [f"- [{s.title}](#{_anchor(s.title)})" for s in all_sections]
    for s in all_sections:
        lines += ["", f"## {s.title}", ""]
        if s.intro:
            lines += [_text(s.intro), ""]
        if not s.keys:
            lines.append("No other keys.")
            continue
        lines += ["| key | type | default | allowed | meaning |", "|---|---|---|---|---|"]
        lines += [
            f"| `{k.key}` | {k.type} | {_cell(k.default)} | {_cell(k.allowed)} | {_cell(k.meaning or MISSING_TEXT)} |"
            for k in s.keys
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cfl_mpi.commands.config_reference",
        description="Print the configuration reference generated from the typed config.",
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--write", action="store_true", help=f"write it to {CONFIG_MD.relative_to(PROJECT_ROOT)}")
    what.add_argument(
        "--check",
        action="store_true",
        help=f"exit 1 if {CONFIG_MD.relative_to(PROJECT_ROOT)} differs from what would be generated",
    )
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        CONFIG_MD.write_text(text)
        print(f"wrote {CONFIG_MD.relative_to(PROJECT_ROOT)} ({len(text.encode())} bytes)", file=sys.stderr)
    elif args.check:
        if not CONFIG_MD.is_file() or CONFIG_MD.read_text() != text:
            print(f"{CONFIG_MD.relative_to(PROJECT_ROOT)} is out of date: run {COMMAND}", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    for key in missing_explanations():
        print(f"warning: {key} has no explanation in its source", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
