"""The public surface is what docs/api.md lists, pinned in remote_magic.__all__, and every name imports."""

from __future__ import annotations

import re
from pathlib import Path

import remote_magic

API = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def test_the_public_names_are_exactly_the_documented_ones() -> None:
    documented = re.findall(r"^\| `(\w+)` \|", API.read_text(), flags=re.M)
    assert sorted(documented) == sorted(remote_magic.__all__)
    assert len(set(documented)) == len(documented)
    for name in remote_magic.__all__:
        assert getattr(remote_magic, name) is not None, name


def test_every_error_derives_from_the_one_root() -> None:
    errors = [getattr(remote_magic, n) for n in remote_magic.__all__ if n.endswith(("Error", "Failed", "Mismatch"))
              or n in ("Busy", "OverBudget", "WorkerLost", "ExecutorDied", "JobCancelled", "JobTimeout", "NoSuchJob",
                       "NoSuchWorker", "NoMatchingWorker")]
    assert len(errors) == 32
    assert all(issubclass(e, remote_magic.RemoteMagicError) for e in errors)
