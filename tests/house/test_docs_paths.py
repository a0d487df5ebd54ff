"""Every repository path, link, anchor and `remote_magic.` name that README and docs/ cite exists, and
every identifier the glossary says gives a word a second meaning is where it says.

Paths are written as the repository holds them, relative to its root: `worker/executor.py`, not
`remote_magic/worker/executor.py` (where it is installed): the one way a reader can open the file
from a clone. Links are relative to the page that holds them, and an anchor (`semantics.md#files`)
must name a heading of its page as GitHub spells it.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TOP_LEVEL = {path.name for path in REPO.iterdir() if not path.name.startswith(".")
             and not path.name.endswith(".egg-info") and path.name not in ("build", "dist")}
"""What a path cited from the repository's root starts with: its folders and files."""

FILE_SUFFIXES = (".py", ".md", ".txt", ".wgsl", ".ipynb", ".sh", ".toml", ".json")
"""A path ending so names a file: one that starts with no top-level name of the repository (say
`shared/colab/pip-freeze.txt`) points outside it."""

NOT_REPOSITORY_PATHS = {"dist/remote_magic-0.1.0-py3-none-any.whl", "path/to/a.ipynb"}
"""Paths the docs name that are not the repository's: a build's output, a placeholder."""

_PATH = re.compile(r"(?<![\w/.~:$<@-])((?:[\w.-]+/)+[\w.*-]*)")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_DOTTED = re.compile(r"`(remote_magic(?:\.\w+)+)")


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)  # a "# comment" in code is no heading
    anchors: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.MULTILINE):
        slug, n = _slug(heading), 0
        while (slug if n == 0 else f"{slug}-{n}") in anchors:  # GitHub numbers a repeated heading
            n += 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _cited_paths(page: Path) -> list[str]:
    text = _LINK.sub("", page.read_text())  # links are checked on their own, relative to the page
    text = re.sub(r"<?https?://\S+", "", text)
    cited = []
    for path in _PATH.findall(text):
        path = path.rstrip(".")
        first = path.split("/")[0]
        if path not in NOT_REPOSITORY_PATHS and (first in TOP_LEVEL or path.endswith(FILE_SUFFIXES)):
            cited.append(path)
    return cited


def _missing(path: str) -> bool:
    if "*" in path:  # `shaders/*.wgsl`: some file matches
        return not list(REPO.glob(path))
    return not (REPO / path).exists()


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(REPO).as_posix())
def test_every_repository_path_a_page_cites_exists(page: Path) -> None:
    missing = [path for path in _cited_paths(page) if _missing(path)]
    installed = [path for path in missing if path.startswith("remote_magic/") and not _missing(path[13:])]
    assert installed == [], f"write these as the repository holds them (without remote_magic/): {installed}"
    assert missing == [], f"{page.name} cites paths the repository doesn't have: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(REPO).as_posix())
def test_every_link_and_anchor_a_page_has_exists(page: Path) -> None:
    wrong = []
    for target in _LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # https://, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists() or REPO not in (linked, *linked.parents):
            wrong.append(target)
        elif anchor and (linked.suffix != ".md" or anchor not in _anchors(linked)):
            wrong.append(target)
    assert wrong == [], f"{page.name} links to what doesn't exist: {wrong}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(REPO).as_posix())
def test_every_remote_magic_name_a_page_cites_exists(page: Path) -> None:
    missing = []
    for dotted in _DOTTED.findall(page.read_text()):
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):  # the longest module it starts with, then attributes
            module = ".".join(parts[:cut])
            try:
                found: object = importlib.import_module(module)
            except ModuleNotFoundError as exc:
                if exc.name != module:  # the module exists, and one it imports is missing: say so
                    raise
                continue
            for attribute in parts[cut:]:
                found = getattr(found, attribute, None)
            if found is None:
                missing.append(dotted)
            break
    assert missing == [], f"{page.name} names what remote_magic doesn't have: {missing}"


_SECOND_MEANING = re.compile(r"`([\w.-]+)` in `([\w/.]+\.py)`")
"""In docs/architecture.md's glossary: `Name.attribute` in `path/to/file.py`."""


def test_each_identifier_the_glossary_gives_a_second_meaning_is_in_its_file() -> None:
    """docs/architecture.md says its words have one meaning each, and lists the identifiers that give one a
    second: when one is renamed, its row goes too, and the list stays true."""
    glossary = (REPO / "docs" / "architecture.md").read_text().partition("### Identifiers that give a word")[2]
    cited = _SECOND_MEANING.findall(glossary)
    assert len(cited) >= 6
    gone = []
    for name, path in cited:
        source = (REPO / path).read_text()
        found = name == Path(path).stem or (name.startswith("--") and f'"{name}"' in source) or all(
            re.search(rf"\b{re.escape(part)}\b", source) for part in name.split("."))
        if not found or (("." in name) and not re.search(rf"^class {name.split('.')[0]}\b", source, flags=re.M)):
            gone.append(f"{name} in {path}")
    assert gone == []


def test_the_checks_see_paths_and_anchors() -> None:
    assert "remote_magic/wire/chunks.py" in _cited_paths(REPO / "docs" / "protocol.md")
    assert "exactly-once" in _anchors(REPO / "docs" / "protocol.md")
    assert _slug("A `gpu` object: Modes, and adapters!") == "a-gpu-object-modes-and-adapters"
