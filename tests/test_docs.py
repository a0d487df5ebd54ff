"""README and docs/ name only flags and magics that exist, and document every remote-worker flag.

The flags come from the real parsers: `remote-worker`'s argparse and each magic's @argument list.
"""

from __future__ import annotations

import re
from pathlib import Path

from remote_magic.notebook.magics import OffloadMagics
from remote_magic.worker.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
DOCS = {path.relative_to(REPO).as_posix(): path.read_text() for path in [REPO / "README.md",
                                                                        *sorted((REPO / "docs").glob("*.md"))]}
MAGICS = {name: getattr(OffloadMagics, method) for kind in ("line", "cell")  # as the extension registers them
          for name, method in OffloadMagics.magics[kind].items()}


def _worker_flags() -> set[str]:
    parser = build_parser()
    flags = {f for action in parser._actions for f in action.option_strings if action.help != "==SUPPRESS=="}
    subparsers = list(parser._subparsers._group_actions[0].choices.values())  # type: ignore[union-attr]
    while subparsers:  # `remote-worker token`, `remote-worker kernelspec install`, ...
        sub = subparsers.pop()
        flags |= {f for action in sub._actions for f in action.option_strings}
        if sub._subparsers is not None:
            subparsers.extend(sub._subparsers._group_actions[0].choices.values())  # type: ignore[attr-defined]
    return flags


def _magic_flags(name: str) -> set[str]:
    parser = getattr(MAGICS[name], "parser", None)  # @magic_arguments builds it; magics without options have none
    return {f for action in parser._actions for f in action.option_strings} if parser is not None else set()


def _mentions(pattern: str) -> list[tuple[str, str]]:
    return [(doc, match) for doc, text in DOCS.items() for line in text.splitlines()
            for match in re.findall(pattern, line)]


def test_every_remote_worker_flag_the_docs_name_exists() -> None:
    flags = _worker_flags()
    named = [(doc, flag) for doc, text in DOCS.items() for line in text.splitlines() if "remote-worker" in line
             for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", line)]
    assert named, "the docs name no remote-worker flag at all"
    assert [(doc, flag) for doc, flag in named if flag not in flags] == []


def test_every_remote_worker_flag_is_documented_in_the_readme() -> None:
    readme = DOCS["README.md"]
    assert sorted(f for f in _worker_flags() if f.startswith("--") and f != "--help" and f not in readme) == []


def test_every_magic_and_magic_flag_the_docs_name_exists() -> None:
    named = _mentions(r"%%?(offload\w*)((?: \[?--[a-z-]+)*)")
    assert named
    for doc, (magic, flags) in named:
        assert magic in MAGICS, f"{doc} names %{magic}, which doesn't exist"
        for flag in re.findall(r"--[a-z-]+", flags):
            assert flag in _magic_flags(magic) or flag == "--help", f"{doc}: %{magic} has no {flag}"


def test_every_magic_is_documented_in_the_readme() -> None:
    assert sorted(m for m in MAGICS if f"%{m}" not in DOCS["README.md"]) == []


def test_every_flag_and_magic_the_docs_name_is_exercised_by_a_test_or_an_example() -> None:
    exercised = "\n".join(path.read_text() for folder in ("tests", "examples") for path in (REPO / folder).rglob("*")
                          if path.suffix in (".py", ".ipynb") and path.name != "test_docs.py")
    named = {flag for flag in _worker_flags() | {f for m in MAGICS for f in _magic_flags(m)}
             if flag.startswith("--") and flag != "--help" and any(flag in text for text in DOCS.values())}
    named |= {m for m in MAGICS}
    assert sorted(n for n in named if f'"{n}"' not in exercised and f" {n}" not in exercised
                  and f"%{n}" not in exercised and f'"{n.lstrip("-")}"' not in exercised) == []
