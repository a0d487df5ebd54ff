"""README and docs/ name only flags and magics that exist, document every remote-worker flag, and give
the sizes the code uses as the code has them (MB is 10**6 bytes, MiB 2**20).

The flags come from the real parsers: `remote-worker`'s argparse and each magic's @argument list.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from remote_magic import file_copy
from remote_magic.notebook.magics import MAGICS_CLASSES
from remote_magic.notebook.notices import NOTICE_SIZE_BYTES
from remote_magic.wire.protocol import MAX_HEADER_BYTES
from remote_magic.wire.sizes import size_in_bytes
from remote_magic.worker.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
DOCS = {path.relative_to(REPO).as_posix(): path.read_text() for path in [REPO / "README.md",
                                                                        *sorted((REPO / "docs").glob("*.md"))]}
MAGICS = {name: getattr(magics, method) for magics in MAGICS_CLASSES  # each group the extension
          for kind in ("line", "cell") for name, method in magics.magics[kind].items()}  # registers, as it does


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


# -- the messages in the source ------------------------------------------------------------------
# A user reads the package's strings too: errors, notices, help texts, docstrings (`%magic?`). Every
# `--flag` and `%magic` named in one must exist, as in the docs.

SOURCE_FOLDERS = ("remote_magic", "worker", "kernel_provider")
CLI_FOLDERS = (*SOURCE_FOLDERS, "benchmarks")  # every command of this repository: what --flags exist

OTHER_TOOLS = {  # flags of other programs, allowed only where the same line or string names the program
    "pip": {"--no-deps"},
    "dask worker": {"--nthreads", "--nworkers"},
    "cloudflared": {"--hostname", "--url"},
    "mypy": {"--strict"},
    "systemd-run": {"--user"},
    "jupyter console": {"--kernel"},
    "Chrome": {"--enable-unsafe-webgpu"},
    "on_a_gpu.sh": {"--prepare"},  # (the benchmarks' shell script: no parser to read its flags from)
}

_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
_OUR_MAGIC = re.compile(r"%%?(offload\w*)((?: \[?--[a-z-]+)*)")  # a magic and the flags right after it
_ANY_MAGIC = re.compile(r"(?<![\w%])%%?([a-z][a-z_]{2,})\b")  # 3 letters or more: not a %s or %d format


def _source_strings() -> list[tuple[str, str]]:
    """(file:line, text) of every string literal in the package, f-strings' literal parts included."""
    found = []
    for folder in SOURCE_FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            where = path.relative_to(REPO).as_posix()
            found += [(f"{where}:{node.lineno}", node.value) for node in ast.walk(ast.parse(path.read_text()))
                      if isinstance(node, ast.Constant) and isinstance(node.value, str)]
    return found


def _docs_lines() -> list[tuple[str, str]]:
    return [(f"{doc}:{number}", line) for doc, text in DOCS.items()
            for number, line in enumerate(text.splitlines(), 1)]


def _defined_flags() -> set[str]:
    """Every --flag some parser of this repository defines: remote-worker's and the magics' (their real
    parsers), and the other commands' (`add_argument("--x", ...)`: the kernel relay, the executor, the
    benchmarks), read from their source."""
    flags = _worker_flags() | {flag for name in MAGICS for flag in _magic_flags(name)} | {"--help"}
    for folder in CLI_FOLDERS:
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
                    flags |= {arg.value for arg in node.args if isinstance(arg, ast.Constant)
                              and isinstance(arg.value, str) and arg.value.startswith("--")}
    return flags


def _ipython_magics() -> set[str]:
    """The magics IPython itself defines (`%load_ext`, `%config`, `%precision`, ...)."""
    from IPython.core import magics as builtin
    from IPython.core.magic import Magics

    classes = [getattr(builtin, name) for name in dir(builtin)]
    return {name for cls in classes if isinstance(cls, type) and issubclass(cls, Magics)
            for kind in ("line", "cell") for name in cls.magics.get(kind, {})}


def _unknown_flags(texts: list[tuple[str, str]]) -> list[tuple[str, str]]:
    defined = _defined_flags()
    return [(where, flag) for where, text in texts for flag in _FLAG.findall(text)
            if flag not in defined
            and not any(tool in text and flag in flags for tool, flags in OTHER_TOOLS.items())]


def _unknown_magics(texts: list[tuple[str, str]]) -> list[tuple[str, str]]:
    known = set(MAGICS) | _ipython_magics()
    wrong = []
    for where, text in texts:
        for magic, flags in _OUR_MAGIC.findall(text):
            if magic not in MAGICS:
                wrong.append((where, f"%{magic}"))
            wrong += [(where, f"%{magic} {flag}") for flag in re.findall(r"--[a-z-]+", flags)
                      if magic in MAGICS and flag not in _magic_flags(magic) | {"--help"}]
        wrong += [(where, f"%{name}") for name in _ANY_MAGIC.findall(text)
                  if name not in known and not name.startswith("offload")]
    return wrong


def test_every_flag_the_docs_name_exists() -> None:
    assert _unknown_flags(_docs_lines()) == []


def test_every_magic_the_docs_name_exists_with_its_flags() -> None:
    assert _unknown_magics(_docs_lines()) == []


def test_every_flag_the_source_names_exists() -> None:
    strings = _source_strings()
    assert any("--max-message-size" in text for _, text in strings)  # the walk sees messages at all
    assert _unknown_flags(strings) == []


def test_every_magic_the_source_names_exists_with_its_flags() -> None:
    strings = _source_strings()
    assert any("%%offload --" in text for _, text in strings)
    assert _unknown_magics(strings) == []


def test_other_tools_flags_are_allowed_only_beside_their_tool() -> None:
    assert _unknown_flags([("example", "pip wheel --no-deps")]) == []
    assert _unknown_flags([("example", "remote-worker --no-deps")]) == [("example", "--no-deps")]
    assert _unknown_magics([("example", "%offload_connect --no-such-flag")]) == [
        ("example", "%offload_connect --no-such-flag")]


_SIZE = r"(\d+(?:\.\d+)? ?[kKMGT]i?B)"
SIZES_SAID = {
    rf"copies (?:of|over) {_SIZE}": file_copy.PROGRESS_MIN_BYTES,
    rf"sizes from {_SIZE}": NOTICE_SIZE_BYTES,
    rf"header is refused before it is used if it is over {_SIZE}": MAX_HEADER_BYTES,
    rf"one JSON object, UTF-8, at most {_SIZE}": MAX_HEADER_BYTES,
}
"""Where README, docs/ and the client's docstrings give a size the code has as a constant: the phrase, and
the constant."""


def test_the_sizes_the_docs_give_are_the_codes() -> None:
    texts = [*DOCS.values(), (REPO / "remote_magic" / "client.py").read_text()]
    said = {pattern: [size for text in texts for size in re.findall(pattern, re.sub(r"\s+", " ", text))]
            for pattern in SIZES_SAID}
    assert [pattern for pattern, sizes in said.items() if not sizes] == []  # each phrase is still in the docs
    wrong = [(size, SIZES_SAID[pattern]) for pattern, sizes in said.items() for size in sizes
             if size_in_bytes(size.replace(" ", "")) != SIZES_SAID[pattern]]
    assert wrong == []
