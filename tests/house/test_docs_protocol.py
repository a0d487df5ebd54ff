"""docs/protocol.md's tables say what the protocol module does: the message types and each one's header
fields (`wire/protocol.py`'s MessageType, `wire/schema.py`'s HEADERS), and what each role may send (what
the hub accepts: `Hub.accepts`); both ways, so nothing is missing and nothing is extra.

How the tables are read: a row per message type, its first cell the type; in its header cell, each
name in backticks outside any bracket (`(...)`, `{...}`, `[...]`) is one of the type's fields, and
what is inside brackets describes it. "the fields of `result`" stands for every field `result`'s row
lists.
"""

from __future__ import annotations

import re
from pathlib import Path

from remote_magic import errors
from remote_magic.hub.broker import Hub
from remote_magic.wire.chunks import UNNUMBERED
from remote_magic.wire.keys import HubKeys
from remote_magic.wire.protocol import PROTOCOL_VERSION, MessageType, Role
from remote_magic.wire.schema import COMMON, HEADERS

PAGE = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
TEXT = PAGE.read_text()
_OPEN, _CLOSE = "([{", ")]}"


def _section(title: str) -> str:
    """The text under the heading ``## title``, up to the next heading of that level."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", TEXT, flags=re.MULTILINE | re.DOTALL)
    assert match is not None, f"docs/protocol.md has no section '## {title}'"
    return match.group(1)


def _table(section: str, first_column: str) -> list[list[str]]:
    """The rows (cells, stripped) of the markdown table in ``section`` whose first column is named
    ``first_column``."""
    lines = section.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(rf"\|\s*{first_column}\s*\|", line))
    rows = []
    for line in lines[start + 2:]:  # past the header and its |---| line
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def _top_level_names(cell: str) -> list[str]:
    """The names in backticks outside any bracket: "`a` (`b`), `c` {`d`: ...}" -> ["a", "c"]."""
    names, depth, i = [], 0, 0
    while i < len(cell):
        char = cell[i]
        if char == "`":
            end = cell.index("`", i + 1)
            if depth == 0:
                names.append(cell[i + 1:end])
            i = end + 1
            continue
        depth += (char in _OPEN) - (char in _CLOSE)
        i += 1
    return names


def _documented_fields() -> dict[str, set[str]]:
    rows = _table(_section("Message types"), "type")
    cells = {row[0].strip("`"): row[2] for row in rows}
    assert len(cells) == len(rows), "a message type has two rows"
    fields: dict[str, set[str]] = {}

    def fields_of(kind: str) -> set[str]:
        if kind not in fields:
            cell = cells[kind]
            included = re.findall(r"the fields of `(\w+)`", cell)
            cell = re.sub(r"the fields of `\w+`", "", cell)
            fields[kind] = set(_top_level_names(cell)).union(*(fields_of(other) for other in included))
        return fields[kind]

    return {kind: fields_of(kind) for kind in cells}


def test_the_page_names_the_protocol_version() -> None:
    assert f"Version: `{PROTOCOL_VERSION.decode()}`" in TEXT


def test_the_message_table_lists_every_message_type_and_no_other() -> None:
    assert sorted(_documented_fields()) == sorted(t.value for t in MessageType)
    assert sorted(HEADERS) == sorted(t.value for t in MessageType)


def test_each_message_types_header_fields_are_the_schemas() -> None:
    documented = _documented_fields()
    wrong = {kind: {"missing": sorted(set(spec.fields) - set(COMMON) - documented[kind]),
                    "extra": sorted(documented[kind] - set(spec.fields))}
             for kind, spec in HEADERS.items()}
    assert {kind: diff for kind, diff in wrong.items() if diff["missing"] or diff["extra"]} == {}


def test_the_fields_every_message_may_carry_are_said_once_above_the_table() -> None:
    above = _section("Message types").split("\n|")[0]
    assert all(f"`{name}`" in above for name in COMMON)


def test_what_each_role_may_send_is_what_the_hub_accepts() -> None:
    rows = _table(_section("Who may send what"), "role")
    documented = {row[0]: set(_top_level_names(row[1])) for row in rows}
    hub = Hub(HubKeys.generate())  # not started: nothing is bound
    try:
        accepted = {role.value: {t.value for t in hub.accepts(role) | {MessageType.HELLO}} for role in Role}
    finally:
        hub.context.term()
    assert documented == accepted


def test_the_error_types_named_exist() -> None:
    paragraph = re.search(r"^Error types .*?\n\n", TEXT, flags=re.MULTILINE | re.DOTALL)
    assert paragraph is not None
    named = re.findall(r"`([A-Z]\w+)`", paragraph.group())
    assert named
    assert [name for name in named if not isinstance(getattr(errors, name, None), type)] == []


def test_the_messages_said_to_go_unnumbered_are_the_links() -> None:
    bullet = re.search(r"\*\*Numbered\.\*\* Every message but (.*?) carries `seq`", _section("Exactly once"),
                       flags=re.DOTALL)
    assert bullet is not None
    assert sorted(re.findall(r"`(\w+)`", bullet.group(1))) == sorted(t.value for t in UNNUMBERED)


def test_the_table_reader() -> None:
    assert _top_level_names("`a` (`b`, {`c`}), `d` [`e`] {`f`: `g`}") == ["a", "d"]
    assert _top_level_names("`x` (see `[y]`), `z`") == ["x", "z"]
