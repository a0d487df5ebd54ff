"""What a cell changed in its namespace, found by comparing it before and after the cell: names it
bound, rebound or deleted (star imports, ``globals()[...]``, ``global`` in the functions it called),
and objects it changed in place (``L.sort()``, ``d.update(...)``, ``model.fit(X)``, a
``numpy.random.Generator`` that drew numbers). No static analysis sees those; for the last, the
executor compares each value's fingerprint.

A fingerprint is the xxh3-128 digest of the value's pickle (protocol 5), its large buffers (numpy
arrays, pandas blocks) hashed in place, out of band, without a copy. xxh3 because it hashes at
memory speed (tens of GB/s), so an unchanged 100 MB array costs milliseconds, not the 100 ms or
more of a cryptographic hash; a collision here only means a changed value is not sent back, and
128 bits make that as unlikely as it gets. A buffer the process knows unchanged without reading it
(an input still on the pages of the shared file it came in: ``held_frames``) is hashed as a token
naming those pages instead (``StandIn``).
"""

from __future__ import annotations

import pickle
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import cloudpickle
import xxhash

from remote_magic.errors import OutputError
from remote_magic.wire.cellcode import names_assigned

Fingerprint = bytes

StandIn = Callable[[memoryview], "bytes | None"]
"""A token for a buffer's bytes, known without reading them, that is the same before and after a cell only
if they didn't change; or None: the bytes are hashed."""


def fingerprint(value: Any, stand_in: StandIn | None = None) -> Fingerprint | None:
    """A digest of everything pickling ``value`` would send; None for what can't be pickled or
    needn't be compared (modules travel by name)."""
    if isinstance(value, types.ModuleType):
        return None
    digest = xxhash.xxh3_128()

    def hash_buffer(buffer: pickle.PickleBuffer) -> bool:
        try:
            raw = buffer.raw()
        except BufferError:  # not contiguous: hash a copy
            digest.update(bytes(buffer))
            return False
        token = stand_in(raw) if stand_in is not None else None
        digest.update(raw if token is None else token)
        return False  # and leave it out of the stream: it is hashed already

    try:
        digest.update(cloudpickle.dumps(value, protocol=5, buffer_callback=hash_buffer))
    except Exception:  # what can't be pickled can't come back either; the cell's outputs say so
        return None
    return digest.digest()


def is_dunder(name: str) -> bool:
    """Python's own ``__bookkeeping__`` names (``__builtins__``, ``__annotations__``), not the cell's."""
    return name.startswith("__") and name.endswith("__")


def namespace_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """Names the code bound or rebound, in the order they now appear."""
    return [name for name, value in after.items()
            if not is_dunder(name) and (name not in before or before[name] is not value)]


def deleted_names(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """Names the code deleted."""
    return [name for name in before if name not in after and not is_dunder(name)]


def fingerprints(values: Mapping[str, Any], stand_in: StandIn | None = None) -> dict[str, Fingerprint]:
    """Fingerprints of the values that have one."""
    found = {name: fingerprint(value, stand_in) for name, value in values.items()}
    return {name: digest for name, digest in found.items() if digest is not None}


def changed_in_place(before: Mapping[str, Fingerprint], namespace: Mapping[str, Any],
                     originals: Mapping[str, Any], stand_in: StandIn | None = None) -> list[str]:
    """Names still bound to the same object as before the cell whose fingerprint changed."""
    return [name for name, digest in before.items() if name in namespace and namespace[name] is originals.get(name)
            and fingerprint(namespace[name], stand_in) != digest]


@dataclass
class CellChanges:
    """What a cell changed: the values that go back (``__value__``: its last expression), the names
    it deleted, those it changed in place, and its inputs it left bound as they were (the notebook
    holds those: what still refers to them goes back as a reference)."""

    values: dict[str, Any]
    deleted: list[str] = field(default_factory=list)
    in_place: list[str] = field(default_factory=list)
    unchanged_inputs: dict[str, Any] = field(default_factory=dict)
    inputs: Mapping[str, Any] = field(default_factory=dict)
    shared: list[Any] = field(default_factory=list)
    """The objects inside the inputs, numbered as the notebook numbered its own (``identity.shared_objects``)."""
    namespace: Mapping[str, Any] = field(default_factory=dict)
    """The globals the code ran in: where the classes it defined find the names their definitions read."""


def cell_changes(code: str, wanted: list[str] | None, inputs: Mapping[str, Any], namespace: Mapping[str, Any],
                 before: Mapping[str, Any], tracked: Mapping[str, Fingerprint], provided: list[Any],
                 complete: bool, stand_in: StandIn | None = None) -> CellChanges:
    """What the cell changed. ``wanted``: the names asked for, or None for every name it bound and
    every object it changed in place (``tracked``: their fingerprints before, taken with ``stand_in``).
    ``provided``: objects the worker put in scope, which stay here. A cell that raised (not
    ``complete``) returns what it got to bind; one that ran through must bind every name asked for."""
    names = names_assigned(code) if wanted is None else [str(n) for n in wanted]
    in_place = changed_in_place(tracked, namespace, before, stand_in) if wanted is None else []
    if wanted is None:  # and what no static analysis sees: star imports, globals()[...], `global` in
        # callees, and objects changed in place by the methods the cell called
        for name in [*namespace_changes(before, namespace), *in_place]:
            if name not in names:
                names.append(name)
    missing = [n for n in names if n not in namespace] if wanted is not None and complete else []
    if missing:
        raise OutputError(f"the code did not assign {', '.join(missing)}, which you asked for", missing[0])
    # A name the code would assign but didn't (`if model is None: model = ...`) still holds its input,
    # unchanged: it stays as it is in the notebook, shared with whatever shares it there.
    untouched = {name for name in tracked if name not in in_place and name in namespace
                 and namespace[name] is before.get(name)} if wanted is None else set()
    values = {name: namespace[name] for name in names
              if name in namespace and name not in untouched and not any(namespace[name] is obj for obj in provided)}
    unchanged = {name: value for name, value in inputs.items() if name not in values and namespace.get(name) is value}
    return CellChanges(values, deleted_names(before, namespace), in_place, unchanged, inputs, namespace=namespace)
