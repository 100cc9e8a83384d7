"""The parts of docs/ that are generated from the code: the settings table, the profiles'
pins and the estimator reference.

Why generated: the settings (``REWARDD_*``) and the advantage catalogue each have one source
of truth in the code (the pydantic Settings model with its field descriptions; the
registry with its parameter models and docstrings, from which ``GET /v1/estimators`` is
built), and a table copied by hand into a document drifts the first time a setting, a
default or a description changes (the README's hand-kept Layout section had fallen behind
the tree that way). So each lives in its document between two marker lines, written by this
module; ``tests/unit/test_docs.py`` fails, naming the command to run,
when a block differs from what the code gives now. The text around the blocks is written by
hand. The cost: a change of a setting's or an entry's description also changes docs/, in
the same commit, exactly as a change of the contract regenerates ``openapi/openapi.json``.

    .venv/bin/python -m tests.support.docs_tables           # rewrite the blocks
    .venv/bin/python -m tests.support.docs_tables --check   # exit 1 where one is stale
"""

from __future__ import annotations

import json
import re
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import click
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[2]
REGENERATE = ".venv/bin/python -m tests.support.docs_tables"


# ---- rendering helpers -------------------------------------------------------------------

def cell(text: str) -> str:
    """``text`` as one markdown table cell: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def paragraphs(text: str) -> str:
    """A docstring as markdown paragraphs: lines joined, blank lines kept as breaks."""
    return "\n\n".join(" ".join(block.split()) for block in re.split(r"\n\s*\n", text.strip())
                       if block.strip())


def type_text(annotation: Any) -> str:
    """A parameter's type as a user reads it in JSON terms (``"group" | "batch"``, ``[float,
    float] | null``), not Python's repr."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_text(args[0])
    if annotation is type(None):
        return "null"
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(type_text(arg) for arg in args)
    if origin is typing.Literal:
        return " \\| ".join(json.dumps(arg) for arg in args)
    if origin is tuple:
        return "[" + ", ".join(type_text(arg) for arg in args) + "]"
    if origin is dict:
        return "{" + type_text(args[0]) + ": " + type_text(args[1]) + "}"
    if origin is list:
        return "[" + type_text(args[0]) + ", ...]"
    names = {str: "string", int: "int", float: "float", bool: "bool"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def default_text(field: FieldInfo) -> str:
    """A field's default as JSON (``unset`` for None, ``required`` for none at all)."""
    if field.default_factory is not None:
        return "`" + json.dumps(field.default_factory()) + "`"  # type: ignore[call-arg]
    if field.default is PydanticUndefined:
        return "required"
    if field.default is None:
        return "unset"
    return "`" + json.dumps(field.default) + "`"


# ---- the settings table (docs/operations.md) ---------------------------------------------

def _owner(settings_cls: type, name: str) -> type:
    """The class of the settings hierarchy that declares field ``name``."""
    for klass in settings_cls.__mro__:
        if name in klass.__dict__.get("__annotations__", {}):
            return klass
    raise LookupError(name)


def _source_file(klass: type) -> str:
    """``rewardd.workers.settings`` -> ``workers/settings.py``."""
    return klass.__module__.removeprefix("rewardd.").replace(".", "/") + ".py"


def _flags(command_group: click.Group) -> dict[str, list[tuple[str, str]]]:
    """Per settings field, the CLI flags that set it, with their command."""
    found: dict[str, list[tuple[str, str]]] = {}
    for command_name, command in sorted(command_group.commands.items()):
        for param in command.params:
            if isinstance(param, click.Option) and param.name:
                found.setdefault(param.name, []).append((param.opts[0], command_name))
    return found


def _flag_text(flags: list[tuple[str, str]]) -> str:
    by_flag: dict[str, list[str]] = {}
    for flag, command in flags:
        by_flag.setdefault(flag, []).append(command)
    return "<br>".join(f"`{flag}` ({', '.join(commands)})" for flag, commands in by_flag.items())


def _setting_default(field: FieldInfo) -> str:
    """Settings read from the environment: an empty string means unset too, and a default
    computed at start (the CPU count) is not one number."""
    if field.default_factory is not None:
        return "computed at start"
    if field.default in (None, ""):
        return "unset"
    if isinstance(field.default, bool):
        return "on" if field.default else "off"
    if isinstance(field.default, float) and field.default.is_integer():
        return f"`{int(field.default)}`"
    return f"`{field.default}`"


SETTINGS_SECTIONS = ("Settings", "WorkerSettings", "SandboxSettings", "JudgeSettings")
"""Order of the tables: the API's own settings, then execution, sandbox, judges."""

SETTINGS_TITLES = {
    "Settings": "The API",
    "WorkerSettings": "Execution: the embedded pool, Celery, workers, logs",
    "SandboxSettings": "Ceilings of the code sandbox",
    "JudgeSettings": "Judges and models",
}


def settings_table() -> str:
    """Every ``REWARDD_*`` setting, one table per class that declares it, in field order."""
    from rewardd.service.cli import main
    from rewardd.service.environment import variables_of
    from rewardd.service.settings import Settings

    flags = _flags(main)
    rows: dict[str, list[str]] = {name: [] for name in SETTINGS_SECTIONS}
    files: dict[str, str] = {}
    for name, field in Settings.model_fields.items():
        owner = _owner(Settings, name)
        files[owner.__name__] = _source_file(owner)
        variables = variables_of(name)
        alias = field.validation_alias
        others = [str(c) for c in getattr(alias, "choices", ()) if str(c) not in variables]
        variable = ", ".join(f"`{v}`" for v in variables)
        if others:
            variable += " (or " + ", ".join(f"`{v}`" for v in others) + ")"
        rows[owner.__name__].append(
            f"| {variable} | {_flag_text(flags.get(name, [])) or ' '} | "
            f"{_setting_default(field)} | {cell(field.description or '')} |")
    out = []
    for owner_name in SETTINGS_SECTIONS:
        if not rows[owner_name]:
            continue
        out += [f"#### {SETTINGS_TITLES[owner_name]} (`{files[owner_name]}`)", "",
                "| variable | flag | default | meaning |", "|---|---|---|---|",
                *rows[owner_name], ""]
    return "\n".join(out).rstrip() + "\n"


# ---- the estimator reference (docs/estimators.md) ----------------------------------------

KIND_TITLES = {
    "transform": "Reward transforms (`transforms`)",
    "estimator": "Estimators (`estimator`)",
    "aggregate": "Multi-reward aggregates (`aggregate`)",
    "reweight": "Reweighting (`reweight`)",
    "filter": "Filters and sampling advice (`filters`)",
}


def params_table(model: type[BaseModel]) -> list[str]:
    if not model.model_fields:
        return ["No parameters."]
    lines = ["| param | type | default | meaning |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        lines.append(f"| `{name}` | {type_text(field.annotation)} | {default_text(field)} | "
                     f"{cell(field.description or '')} |")
    return lines


def _aliases_text(name: str) -> list[str]:
    from rewardd.advantages.profiles import aliases_of

    lines = []
    for profile, names in sorted(aliases_of(name).items()):
        for alias, info in sorted(names.items()):
            pinned = (" with " + ", ".join(f"`{k}` = `{json.dumps(v)}`"
                                           for k, v in info["params"].items())
                      if info["params"] else "")
            lines.append(f"- `{alias}` under profile `{profile}`: `{name}`{pinned}. "
                         f"{cell(info['note'])}")
    return lines


def estimator_reference() -> str:
    """Every registry entry, by kind in pipeline order, then by name (as
    ``GET /v1/estimators`` lists them)."""
    from rewardd.advantages.registry import ENTRIES, KINDS

    out: list[str] = []
    for kind in KINDS:
        out += [f"### {KIND_TITLES[kind]}", ""]
        for entry in sorted((e for e in ENTRIES.values() if e.kind == kind),
                            key=lambda e: e.name):
            inputs = ", ".join(f"`{i}`" for i in entry.inputs) or "none declared"
            out += [f"#### `{entry.name}`", "",
                    f"{entry.kind}; formula: `{entry.formula}`", "",
                    f"Reads: {inputs}." + (" Stateful: keeps per-run state, needs a `run_id`."
                                           if entry.stateful else ""),
                    f"Source: {entry.source}.", "",
                    paragraphs(entry.description), ""]
            aliases = _aliases_text(entry.name)
            if aliases:
                out += ["Trainer names that resolve to this entry:", "", *aliases, ""]
            out += [*params_table(entry.Params), ""]
    return "\n".join(out).rstrip() + "\n"


WHITENING_FORMULAS = {
    "var_plus": "(x - mean) * rsqrt(var + {eps})",
    "std_plus": "(x - mean) / (std + {eps})",
    "var_clamp": "(x - mean) * rsqrt(max(var, {eps}))",
}


def _whitening_text(pins: Any) -> str:
    """The entries a profile whitens over the batch, grouped by how."""
    by_rule: dict[Any, list[str]] = {}
    for entry, rule in sorted(pins.whitening.items()):
        by_rule.setdefault(rule, []).append(f"`{entry}`")
    parts = []
    for rule, entries in by_rule.items():
        formula = WHITENING_FORMULAS.get(rule.mode, rule.mode).format(eps=f"{rule.eps:g}")
        how = (f"{formula}, ddof {rule.ddof}, over {rule.level}s"
               + ("" if rule.scale else ", centred only"))
        parts.append(f"{', '.join(entries)}: {how}")
    return "; ".join(parts) or "none"


def profiles_table() -> str:
    """The pins of every profile (``advantages/profiles.py``), one row per pin."""
    from rewardd.advantages.profiles import PROFILES

    profiles = list(PROFILES)
    rows: list[tuple[str, Callable[[Any], str]]] = [
        ("std ddof (1: unbiased)", lambda p: f"{p.std_ddof}"),
        ("epsilon added to the std", lambda p: f"{p.eps:g}"),
        ("group with one included rollout (`singleton`)", lambda p: f"`{p.singleton}`"),
        ("every group the same size", lambda p: "yes" if p.equal_group_sizes else "no"),
        ("how the trainer groups (documentation)", lambda p: p.grouping),
        ("batch whitening", _whitening_text),
        ("gpg's valid samples (`count`)", lambda p: f"`{p.gpg_count}`"),
        ("mask-0 tokens inside a response (`holes`)",
         lambda p: "; ".join(f"`{e}`: `{r}`" for e, r in sorted(p.holes.items()))
         or "`carry`"),
        ("failed component, no fallback (`missing`)", lambda p: f"`{p.missing}`"),
        ("default `clip_range`", lambda p: f"`{list(p.clip_range)}`" if p.clip_range
         else "none"),
    ]
    lines = ["| pin | " + " | ".join(f"`{p.value}`" for p in profiles) + " |",
             "|---|" + "---|" * len(profiles)]
    for title, render in rows:
        lines.append(f"| {title} | " + " | ".join(cell(render(PROFILES[p])) for p in profiles)
                     + " |")
    return "\n".join(lines + ["", *aliases_table()]) + "\n"


def aliases_table() -> list[str]:
    """The trainers' own estimator names (``advantages/profiles.py``, ``ALIASES``)."""
    from rewardd.advantages.profiles import ALIASES

    lines = ["| profile | trainer's name | registry entry | pinned params | note |",
             "|---|---|---|---|---|"]
    for profile, names in ALIASES.items():
        for name, alias in names.items():
            pinned = ", ".join(f"`{k}` = `{json.dumps(v)}`" for k, v in alias.params.items())
            lines.append(f"| `{profile.value}` | `{name}` | `{alias.entry}` | {pinned or 'none'} "
                         f"| {cell(alias.note)} |")
    return lines


# ---- the blocks in their documents -------------------------------------------------------

@dataclass(frozen=True)
class Block:
    """A generated block: ``name`` in its markers, in ``document``, rendered by ``render``."""

    name: str
    document: str
    render: Callable[[], str]

    @property
    def begin(self) -> str:
        return f"<!-- BEGIN GENERATED {self.name}: {REGENERATE} -->"

    @property
    def end(self) -> str:
        return f"<!-- END GENERATED {self.name} -->"


BLOCKS = (Block("settings", "docs/operations.md", settings_table),
          Block("profiles", "docs/estimators.md", profiles_table),
          Block("estimators", "docs/estimators.md", estimator_reference))


def current(block: Block, text: str) -> str:
    """What ``text`` holds between ``block``'s markers (ValueError when a marker is missing)."""
    start = text.index(block.begin) + len(block.begin)
    return text[start:text.index(block.end, start)].strip("\n") + "\n"


def write(block: Block, text: str) -> str:
    start = text.index(block.begin) + len(block.begin)
    stop = text.index(block.end, start)
    return text[:start] + "\n" + block.render() + text[stop:]


def main(argv: list[str]) -> int:
    stale = []
    for block in BLOCKS:
        path = ROOT / block.document
        text = path.read_text(encoding="utf-8")
        if current(block, text) == block.render():
            continue
        stale.append(block.document)
        if "--check" not in argv:
            path.write_text(write(block, text), encoding="utf-8")
    verb = "stale" if "--check" in argv else "rewritten"
    for document in stale:
        print(f"{document}: {verb}")
    return 1 if stale and "--check" in argv else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
