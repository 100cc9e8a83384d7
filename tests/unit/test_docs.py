"""docs/ stays true: every document the code or the docs cite exists, every link lands on a
heading, the generated tables equal what the code gives, and the module map names the tree.

The code once cited two design notes by file name that were never in the repository, so a
reader could not follow the reference; these tests make such a citation fail where it is
written. Pure file reading: no server, no Redis.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.docs_tables import BLOCKS, REGENERATE, current

ROOT = Path(__file__).resolve().parents[2]

SCANNED = ("service", "workers", "verifiers", "advantages", "clients", "tests", "deploy", "docs",
           "openapi")
"""Folders whose files' ``.md`` citations must resolve, with the top-level files below."""
SCANNED_FILES = ("Makefile", "README.md", "pyproject.toml")
TEXT_SUFFIXES = {".py", ".md", ".yml", ".yaml", ".toml", ".txt", ".tpl", ".mjs", ".sh", ".cfg",
                 ".ini", ".json", ".dockerignore"}
SKIPPED_PARTS = {".venv", "node_modules", "__pycache__", ".pytest_cache", ".mypy_cache"}
SKIPPED_SUFFIXES = (".egg-info",)
SKIPPED_FILES = {"tests/unit/test_docs.py"}
"""This file names citations in its own examples."""

DOCS = ("docs/architecture.md", "docs/estimators.md", "docs/operations.md")

URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.IGNORECASE)
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
BARE_MD = re.compile(r"(?<![\w./-])((?:\.\.?/)*[\w.-]+(?:/[\w.-]+)*\.md)\b")
FENCE = re.compile(r"^\s*(```|~~~)")


def scanned_files() -> list[Path]:
    files = [ROOT / name for name in SCANNED_FILES]
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*")):
            parts = set(path.relative_to(ROOT).parts)
            if (not path.is_file() or parts & SKIPPED_PARTS or rel(path) in SKIPPED_FILES
                    or any(p.endswith(SKIPPED_SUFFIXES) for p in parts)):
                continue
            if path.suffix in TEXT_SUFFIXES or path.name.startswith(("Dockerfile", "Makefile")):
                files.append(path)
    return files


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def resolves(citing: Path, target: str) -> Path | None:
    """The file or folder ``target`` names: relative to the citing file, else (a bare path in
    code) relative to the repository root."""
    for base in (citing.parent, ROOT):
        candidate = (base / target).resolve()
        if candidate.exists() and candidate.is_relative_to(ROOT):
            return candidate
    return None


def markdown_links(text: str) -> list[str]:
    return [target for target in LINK.findall(text)
            if not URL.match(target) and not target.startswith("mailto:")]


def bare_md_paths(text: str) -> list[str]:
    without_urls = URL.sub(" ", text)
    return BARE_MD.findall(without_urls)


def test_every_md_citation_resolves_to_a_file_in_the_repository() -> None:
    unresolved = []
    for path in scanned_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        cited = [t.split("#", 1)[0] for t in markdown_links(text) if t.split("#", 1)[0]]
        cited += bare_md_paths(text)
        for target in dict.fromkeys(cited):
            if not target.endswith(".md") and path.suffix != ".md":
                continue  # links in markdown may name any file; code is checked for .md
            if resolves(path, target) is not None:
                continue
            unresolved.append(f"{rel(path)}: {target}")
    assert not unresolved, ("citations of files that are not in the repository (write the "
                            "path from the repository root, e.g. docs/estimators.md):\n"
                            + "\n".join(unresolved))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|<[^>]+>", lambda m: "_" if m.group() == "_" else "", heading.strip())
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file (fenced code skipped; repeats get -1, -2)."""
    found: dict[str, int] = {}
    in_fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        match = None if in_fence else re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(2))
            count = found.get(base, 0)
            found[base] = count + 1
            if count:
                found[f"{base}-{count}"] = 1
    return set(found)


def test_slug_follows_githubs_rule() -> None:
    assert slug("Shared infrastructure: workers, jobs and tenants") == (
        "shared-infrastructure-workers-jobs-and-tenants")
    assert slug("In process, without a server") == "in-process-without-a-server"
    assert slug("Profiles: trainer conventions") == "profiles-trainer-conventions"
    assert slug("`grpo`") == "grpo"
    assert slug("`reinforce_pp`") == "reinforce_pp"


def test_every_link_into_a_markdown_file_lands_on_a_heading() -> None:
    broken = []
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "deploy/README.md"]:
        for target in markdown_links(path.read_text(encoding="utf-8")):
            file_part, _, fragment = target.partition("#")
            if not fragment:
                continue
            document = resolves(path, file_part) if file_part else path
            if document is None or document.suffix != ".md":
                continue  # a missing file is the test above's
            if fragment not in anchors(document):
                broken.append(f"{rel(path)}: {target}")
    assert not broken, "links to headings that do not exist:\n" + "\n".join(broken)


def test_the_readme_links_into_every_document_of_docs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = {t.partition("#")[0] for t in markdown_links(readme)}
    assert set(DOCS) <= linked, f"not linked from the README: {sorted(set(DOCS) - linked)}"
    assert {rel(p) for p in (ROOT / "docs").glob("*.md")} <= linked


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.name)
def test_generated_block_equals_what_the_code_gives(block) -> None:
    text = (ROOT / block.document).read_text(encoding="utf-8")
    assert current(block, text) == block.render(), (
        f"{block.document}: the generated {block.name} block is stale; run {REGENERATE}")


def test_settings_table_lists_every_setting_once() -> None:
    from rewardd.service.environment import variables_of
    from rewardd.service.settings import Settings

    [settings] = [b for b in BLOCKS if b.name == "settings"]
    table = current(settings, (ROOT / settings.document).read_text(encoding="utf-8"))
    rows = [line for line in table.splitlines() if line.startswith("| `REWARDD_")]
    assert len(rows) == len(Settings.model_fields)
    for name in Settings.model_fields:
        assert sum(f"| `{variables_of(name)[0]}`" in row for row in rows) == 1, name


def test_estimator_reference_has_one_heading_per_registry_entry() -> None:
    from rewardd.advantages.registry import ENTRIES

    headings = re.findall(r"^#### `(\w+)`$",
                          (ROOT / "docs/estimators.md").read_text(encoding="utf-8"), re.M)
    assert sorted(headings) == sorted(ENTRIES)


LIBRARIES = ("service", "workers", "advantages", "verifiers")


def module_map() -> str:
    text = (ROOT / "docs/architecture.md").read_text(encoding="utf-8")
    start = text.index("<!-- module-map:")
    return text[start:text.index("<!-- module-map end -->", start)]


def test_module_map_names_only_paths_that_exist() -> None:
    named = re.findall(r"`([\w./-]+(?:\.py|/))`", module_map())
    missing = [path for path in named if not (ROOT / path).exists()]
    assert not missing, f"docs/architecture.md's module map names what is not there: {missing}"


def test_module_map_names_every_module_and_package_of_the_four_libraries() -> None:
    section = module_map()
    named = set(re.findall(r"`([\w./-]+(?:\.py|/))`", section))
    expected = []
    for library in LIBRARIES:
        for path in sorted((ROOT / library).iterdir()):
            if path.name.startswith(("_", ".")) or path.name.endswith("_pb2.py"):
                continue
            if path.suffix == ".py":
                expected.append(f"{library}/{path.name}")
            elif path.is_dir() and (path / "__init__.py").exists():
                expected.append(f"{library}/{path.name}/")
    unnamed = [path for path in expected if path not in named]
    assert not unnamed, ("docs/architecture.md's module map does not name (add a line, or "
                         f"remove what moved): {unnamed}")


def test_the_readme_lists_every_registry_entry_under_its_kind() -> None:
    from rewardd.advantages.registry import ENTRIES, KINDS

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    listed = {kind: sorted(re.findall(r"`(\w+)`", row))
              for kind, row in re.findall(rf"^\| ({'|'.join(KINDS)}) \| (`.*)\|$", readme, re.M)}
    assert listed == {kind: sorted(n for n, e in ENTRIES.items() if e.kind == kind)
                      for kind in KINDS}
