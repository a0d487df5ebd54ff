"""What a job asks of the worker that runs it: ``--require`` and ``--prefer``, parsed once for both sides.

A requirement is a trait name alone (``gpu``: the worker has it, and it is true) or ``KEY OP VALUE``
with OP one of ``>= <= > < == !=``. VALUE is a number, a size (``16GB``, ``512MiB``, read as
``sizes.py`` reads every size), a version (``3.11``) or a word (``system==Linux``, compared without
case). The traits are what workers report (:func:`traits`) and the labels they were started with
(``remote-worker --label KEY=VALUE``).

The client parses requirements before sending, so a malformed one never leaves the notebook; the
hub parses the SUBMIT header's ``require`` again and places the job on a worker that matches.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ..errors import RequirementError
from .sizes import human_size, size_in_bytes

OPERATORS = (">=", "<=", "==", "!=", ">", "<")
"""Comparisons a requirement may use, longest first (so ``>=`` is not read as ``>``)."""

PREFERENCES = ("fastest",)
"""What ``prefer`` may say: ``fastest`` (see :func:`speed_rank`)."""

BUILTIN_TRAITS = ("gpu", "gpu_type", "gpu_adapter", "gpu_buffer", "memory", "cpus", "speed", "system",
                  "machine", "platform", "python", "hostname")
"""Traits every worker reports; a ``--label`` can't take one of these names."""

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_VERSION = re.compile(r"^\d+(?:\.\d+)+$")
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def parse_quantity(text: str) -> float | None:
    """'16GB' -> 16e9, '512MiB' -> 512 * 2**20, '8' -> 8.0; None when ``text`` is not a number or size."""
    return size_in_bytes(text.strip())


def _version(text: str) -> tuple[int, ...] | None:
    return tuple(int(part) for part in text.split(".")) if _VERSION.match(text) else None


@dataclass(frozen=True)
class Requirement:
    """One ``--require``: ``key`` alone (``op`` and ``value`` empty), or ``key op value``."""

    key: str
    op: str = ""
    value: str = ""

    def __str__(self) -> str:
        return f"{self.key}{self.op}{self.value}"

    def matches(self, traits: Mapping[str, Any]) -> bool:
        """Does a worker with these traits meet it? A worker without the trait never does."""
        have = traits.get(self.key)
        if not self.op:
            return bool(have)
        if have is None:
            return False
        if isinstance(have, bool):
            wanted = self.value.lower() in _TRUE
            return (have == wanted) == (self.op == "==") if self.op in ("==", "!=") else False
        if isinstance(have, (int, float)):
            quantity = parse_quantity(self.value)
            return quantity is not None and _compare(float(have), self.op, quantity)
        text = str(have)
        mine, theirs = _version(text), _version(self.value)
        if mine is not None and theirs is not None:  # python>=3.11 against "3.11.7": compare the parts given
            return _compare(mine[:len(theirs)], self.op, theirs)
        if self.op in ("==", "!="):
            return (text.casefold() == self.value.casefold()) == (self.op == "==")
        return False


def _compare(have: Any, op: str, want: Any) -> bool:
    return bool({">=": have >= want, "<=": have <= want, ">": have > want, "<": have < want,
                 "==": have == want, "!=": have != want}[op])


def parse(text: str) -> Requirement:
    """A requirement from its text; RequirementError says what is wrong with a malformed one."""
    source = str(text).strip()
    op = next((candidate for candidate in OPERATORS if candidate in source), "")
    key, _, value = (part.strip() for part in source.partition(op)) if op else (source, "", "")
    shown = f"--require {source!r}"
    if not _NAME.match(key):
        raise RequirementError(
            f"{shown}: {key!r} is not a trait name. Write a name alone (gpu) or NAME OP VALUE "
            f"(memory>=16GB, cpus>=8, system==Linux), with OP one of {' '.join(OPERATORS)}")
    if op and (not value or any(c.isspace() for c in value) or any(o in value for o in OPERATORS)):
        raise RequirementError(f"{shown}: after {op!r} comes one value, like 16GB, 8, 3.11 or Linux")
    if op in (">=", "<=", ">", "<") and parse_quantity(value) is None and _version(value) is None:
        raise RequirementError(
            f"{shown}: {value!r} is not a number, a size (16GB, 512MiB) or a version (3.11), so it has no order; "
            "use == or != to compare words")
    return Requirement(key, op, value)


def parse_all(texts: Iterable[str] | str | None) -> list[Requirement]:
    """Requirements from a list of texts (or one text, or None)."""
    if texts is None:
        return []
    if isinstance(texts, str):
        texts = [texts]
    return [parse(text) for text in texts]


def check_prefer(prefer: str | None) -> str | None:
    """``prefer`` as sent, or RequirementError when it is not one of PREFERENCES."""
    if prefer is None:
        return None
    if prefer not in PREFERENCES:
        raise RequirementError(f"--prefer {prefer!r} is not known: use {' or '.join(PREFERENCES)}")
    return prefer


def placement_header(require: Iterable[str] | str | None, prefer: str | None) -> dict[str, Any]:
    """The SUBMIT header fields for a job's requirements and preference (none when it has none)."""
    header: dict[str, Any] = {}
    parsed = parse_all(require)
    if parsed:
        header["require"] = [str(r) for r in parsed]
    if check_prefer(prefer) is not None:
        header["prefer"] = prefer
    return header


def traits(worker: Mapping[str, Any]) -> dict[str, Any]:
    """What requirements are matched against, from a worker's capabilities (HELLO, or a ``workers()`` entry)."""
    gpu: Mapping[str, Any] = worker["gpu"] if isinstance(worker.get("gpu"), Mapping) else {}
    limits: Mapping[str, Any] = gpu["limits"] if isinstance(gpu.get("limits"), Mapping) else {}
    found: dict[str, Any] = {
        "gpu": bool(gpu.get("active")), "gpu_type": gpu.get("adapter_type") if gpu.get("adapter") else None,
        "gpu_adapter": gpu.get("adapter"), "gpu_buffer": limits.get("max_buffer_size"),
        "memory": worker.get("memory_bytes"), "cpus": worker.get("cpu_count"), "speed": worker.get("speed"),
        "system": worker.get("system"), "machine": worker.get("machine"), "platform": worker.get("platform"),
        "python": worker.get("python"), "hostname": worker.get("hostname"),
    }
    labels = worker.get("labels")
    for key, value in (labels.items() if isinstance(labels, Mapping) else ()):
        if key not in BUILTIN_TRAITS:
            found[str(key)] = _label_value(str(value))
    return {key: value for key, value in found.items() if value is not None}


def _label_value(text: str) -> Any:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    quantity = parse_quantity(text)
    return quantity if quantity is not None else text


def describe(found: Mapping[str, Any], keys: Iterable[str] | None = None) -> str:
    """Traits as people read them ('memory 16.8 GB, cpus 8, gpu no'), all of them or only ``keys``. A
    built-in trait a worker doesn't report (a browser tab's memory, CPUs, speed) is unknown; a label it
    wasn't started with, one it doesn't have."""
    shown = list(found) if keys is None else [key for key in dict.fromkeys(keys)]
    parts = []
    for key in shown:
        value = found.get(key)
        if value is None:
            parts.append(f"{key} unknown" if key in BUILTIN_TRAITS else f"no {key}")
        elif isinstance(value, bool):
            parts.append(f"{key} {'yes' if value else 'no'}")
        elif key in ("memory", "gpu_buffer") and isinstance(value, (int, float)):
            parts.append(f"{key} {human_size(value)}")
        elif isinstance(value, (int, float)) and value >= 1e6:  # a size from a label, as it was likely written
            parts.append(f"{key} {value / 1e9:g} GB" if value >= 1e9 else f"{key} {value / 1e6:g} MB")
        else:
            parts.append(f"{key} {value:g}" if isinstance(value, float) else f"{key} {value}")
    return ", ".join(parts)
