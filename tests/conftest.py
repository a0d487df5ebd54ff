"""Fixtures that start real remote-worker processes on 127.0.0.1 and connect real clients."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Iterator

import pytest
from IPython.core.interactiveshell import InteractiveShell

import remote_magic
from support import WorkerProcess, build_wheel, connected_shell, start_worker

# tinygrad's own tests: tests/gpu/test_tinygrad_ops.py runs them in a process of their own
collect_ignore = ["gpu/tinygrad"]

TESTS = Path(__file__).resolve().parent

LONGEST_FILES = {
    "gpu/test_tinygrad_ops.py": 159, "notebook/test_colab.py": 118, "end_to_end/test_conformance.py": 112,
    "end_to_end/test_blips.py": 71, "gpu/test_numpy_oracle.py": 66, "end_to_end/test_lossy_link.py": 64,
    "notebook/test_same_as_local.py": 54, "gpu/test_ml.py": 48, "notebook/test_client.py": 47, "hub/test_fuzz.py": 44,
    "hub/test_hub.py": 44, "end_to_end/test_slow_link.py": 40, "worker/test_kernel_provider.py": 38,
    "browser/test_browser.py": 35, "end_to_end/test_conformance_gpu.py": 34, "end_to_end/test_outage.py": 33,
    "hub/test_detached.py": 29, "gpu/test_counting.py": 28, "worker/test_worker_pythons.py": 28,
    "gpu/test_elementwise.py": 26, "hub/test_fleet_run.py": 26, "gpu/test_arg_scan.py": 24,
    "end_to_end/test_soak.py": 24, "worker/test_liveness.py": 23, "worker/test_cli.py": 21,
}
"""The files that take longest, in seconds of a whole suite run on an idle 2-core machine (``--junitxml``'s times):
the suite starts them first. Its processes each take a whole file at a time (``--dist loadfile``), so a
long file started last keeps one process busy while the others idle; longest first, the last files are short.
A file not listed runs after these, in its usual order; the figures only need to be roughly right."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest files first (``LONGEST_FILES``); each file's tests stay in their order."""
    def seconds(item: pytest.Item) -> int:
        try:
            return LONGEST_FILES.get(item.path.relative_to(TESTS).as_posix(), 0)
        except ValueError:  # a test outside tests/ (named on the command line)
            return 0

    items.sort(key=seconds, reverse=True)  # stable: files of equal weight keep their order

# A shell starts background jobs with SIGINT ignored, and Python then leaves it ignored: the tests
# that press Ctrl-C need Python's usual handler wherever the suite is started from.
signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """One shared worker (hub + worker in one process, GPU off) for tests that don't break it."""
    # In a folder of its own: what cells write (%offload_put too) stays out of the repository.
    # The usual heartbeats (a peer silent for 5 s is out of reach): tests share it on a machine that may be busy.
    # A notebook gone (killed, cut off) is forgotten 5 s later, not 5 minutes: its session's process stops then.
    w = start_worker(tmp_path_factory.mktemp("worker"), "--listen", "127.0.0.1:0", "--gpu", "off", "--name", "shared",
                     "--outage-grace", "5", cwd=tmp_path_factory.mktemp("worker-cwd"))
    yield w
    w.stop()


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built once per session as `pip install` would build it."""
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture
def client(worker: WorkerProcess) -> Iterator[remote_magic.Client]:
    with remote_magic.connect(worker.token, timeout=10) as c:
        yield c


@pytest.fixture
def ip(worker: WorkerProcess, monkeypatch: pytest.MonkeyPatch) -> Iterator[InteractiveShell]:
    """A real IPython shell with the extension loaded, connected to the shared worker."""
    monkeypatch.setenv("REMOTE_MAGIC_TOKEN", worker.token)
    with connected_shell("") as (shell, printed):  # falls back to REMOTE_MAGIC_TOKEN
        assert "Connected to tcp://127.0.0.1" in printed and "shared" in printed
        yield shell
