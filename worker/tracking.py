"""What a cell changed in its namespace, found by comparing it before and after the cell: names it
bound, rebound or deleted (star imports, ``globals()[...]``, ``global`` in the functions it called),
and objects it changed in place (``L.sort()``, ``d.update(...)``, ``model.fit(X)``, a
``numpy.random.Generator`` that drew numbers). No static analysis sees those; for the last, the
executor compares each value's fingerprint.

A fingerprint is the xxh3-128 digest of the value's pickle (protocol 5), its large buffers (numpy
arrays, pandas blocks) hashed in place, out of band, without a copy. xxh3 because it hashes at
memory speed (tens of GB/s), so an unchanged 100 MB array costs milliseconds, not the 100 ms or
more of a cryptographic hash; a collision here only means a changed value is not sent back, and
128 bits make that as unlikely as it gets.
"""

from __future__ import annotations

import pickle
import types
from typing import Any, Mapping

import cloudpickle
import xxhash

Fingerprint = bytes


def fingerprint(value: Any) -> Fingerprint | None:
    """A digest of everything pickling ``value`` would send; None for what can't be pickled or
    needn't be compared (modules travel by name)."""
    if isinstance(value, types.ModuleType):
        return None
    digest = xxhash.xxh3_128()

    def hash_buffer(buffer: pickle.PickleBuffer) -> bool:
        try:
            digest.update(buffer.raw())
        except BufferError:  # not contiguous: hash a copy
            digest.update(bytes(buffer))
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


def fingerprints(values: Mapping[str, Any]) -> dict[str, Fingerprint]:
    """Fingerprints of the values that have one."""
    found = {name: fingerprint(value) for name, value in values.items()}
    return {name: digest for name, digest in found.items() if digest is not None}


def changed_in_place(before: Mapping[str, Fingerprint], namespace: Mapping[str, Any],
                     originals: Mapping[str, Any]) -> list[str]:
    """Names still bound to the same object as before the cell whose fingerprint changed."""
    return [name for name, digest in before.items()
            if name in namespace and namespace[name] is originals.get(name) and fingerprint(namespace[name]) != digest]
