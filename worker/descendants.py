"""Every process a job or a kernel starts is its own: found, counted against --max-memory, killed with it.

A job may start processes that leave its executor's process group (``setsid``) or its process tree
(a double fork: the middle process exits and its child is orphaned). To keep them findable,
``remote-worker`` makes itself a child subreaper (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``): an
orphan is re-parented to the worker instead of to init, so everything its executors and kernels
started stays below the worker in the process tree. Each executor and kernel (an *owner*) starts
with ``REMOTE_MAGIC_EXECUTOR=<worker pid>/<owner>`` in its environment, which its descendants
inherit; a process the worker adopted is attributed by that variable, or by the owner it was seen
under in an earlier walk (so one that cleared its environment is still found if it was ever seen).

A walk reads ``/proc/PID/task/*/children`` from the worker down where the kernel has them (the
cost grows with the worker's own processes only), else the parent of every process on the machine.
It runs at most every WALK_INTERVAL_S; a memory check in between reads only the processes found.

Where it can't: without a subreaper (macOS, other systems) a double-forked process leaves the tree
and is neither counted nor killed; a process that clears its environment and leaves its parent
before any walk sees it is not attributed (``remote-worker`` kills it when it stops); and whatever
a job hands to another service (``at``, ``systemd-run``, ssh) is out of reach, as is everything
after ``remote-worker`` itself is SIGKILLed. docs/security.md says so. cgroups would close these
gaps but are rarely writable by the user that runs a worker, and are not used.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Iterable, Mapping

import psutil

log = logging.getLogger(__name__)

OWNER_ENV = "REMOTE_MAGIC_EXECUTOR"
"""In every executor's and kernel's environment, inherited by all they start: ``<worker pid>/<owner>``."""

SECRET_ENV = ("REMOTE_MAGIC_JOIN_TOKEN", "REMOTE_MAGIC_TOKEN", "NGROK_AUTHTOKEN")
"""Credentials the worker may hold in its environment; no job or kernel inherits them (a kernel gets the
client token only when its kernelspec passes it, with --share-token)."""

WALK_INTERVAL_S = 0.25
"""How stale the list of a job's processes may be: how long a new child may go uncounted."""

KILL_ROUNDS = 20
"""Walk-and-kill rounds before giving up on processes that keep forking."""

DEATH_WAIT_S = 1.0
"""How long one round waits for the processes it SIGKILLed to die."""

POLL_S = 0.005
"""Polling period while waiting for processes to die (bounded by DEATH_WAIT_S)."""

PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
LINUX = sys.platform.startswith("linux")

Children = Callable[[int], "list[int]"]
"""A process's children, by pid."""


def child_environment(owner_mark: Mapping[str, str], extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without the worker's credentials, then ``extra``, then ``owner_mark``."""
    env = {name: value for name, value in os.environ.items() if name not in SECRET_ENV}
    return {**env, **(extra or {}), **owner_mark}


def hide_process_memory() -> bool:
    """Make this process non-dumpable (Linux ``PR_SET_DUMPABLE 0``): processes of the same user, its jobs
    included, can no longer read its environment or memory through /proc or ptrace (root still can).
    True where it worked."""
    return _prctl(PR_SET_DUMPABLE, 0)


def _prctl(option: int, value: int) -> bool:
    if not LINUX:
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(option, ctypes.c_ulong(value), ctypes.c_ulong(0), ctypes.c_ulong(0),
                               ctypes.c_ulong(0)) == 0)
    except (OSError, AttributeError):
        return False


class ProcessTree:
    """The processes this worker's executors and kernels started, by owner; one per process (``tree()``)."""

    def __init__(self, children_files: bool | None = None) -> None:
        """``children_files``: walk by /proc/PID/task/*/children (True) or by every process's parent
        (False); None: the first where the kernel has them."""
        self._me = os.getpid()
        self._lock = threading.RLock()
        self._roots: dict[int, str] = {}  # the executors' and kernels' pids -> their owner
        self._seen: dict[int, str] = {}  # every process attributed by the last walk -> its owner
        self._owned: dict[str, list[int]] = {}  # the last walk, by owner ("" for orphans of no known owner)
        self._walked_at = float("-inf")
        self.adopting = False  # set by adopt_orphans(): every child not started here is an orphan of ours
        self._children_files = os.path.exists(f"/proc/{self._me}/task/{self._me}/children") \
            if children_files is None else children_files

    def adopt_orphans(self) -> bool:
        """Make this process the subreaper of everything it starts; True where the OS allows it (Linux).
        Only ``remote-worker`` itself should: from then on it reaps every child it did not start."""
        self.adopting = _prctl(PR_SET_CHILD_SUBREAPER, 1)
        if not self.adopting:
            log.info("this system has no child subreaper: a process a job double-forks leaves the worker's "
                     "process tree, and is neither held to --max-memory nor killed with the job's executor")
        return self.adopting

    def mark(self, owner: str) -> dict[str, str]:
        """The environment entry that makes a process and all its descendants ``owner``'s."""
        return {OWNER_ENV: f"{self._me}/{owner}"}

    def start(self, owner: str, command: list[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        """Start ``owner``'s process in a session of its own, with no stdin, and track it."""
        with self._lock:  # no walk sees it before it is known as a root (and so never reaps it)
            process = subprocess.Popen(command, start_new_session=True, env=dict(env), stdin=subprocess.DEVNULL)
            self._roots[process.pid] = owner
        return process

    def forget(self, owner: str) -> None:
        """``owner``'s root process was waited for: its pid may be reused."""
        with self._lock:
            self._roots = {pid: name for pid, name in self._roots.items() if name != owner}

    def pids(self, owner: str) -> list[int]:
        """``owner``'s processes as of a walk at most WALK_INTERVAL_S old."""
        with self._lock:
            if time.monotonic() - self._walked_at > WALK_INTERVAL_S:
                self._walk()
            return list(self._owned.get(owner, ()))

    def memory(self, owner: str) -> int:
        """Resident bytes of ``owner``'s processes together."""
        return sum(_rss(pid) for pid in self.pids(owner))

    def kill(self, owner: str | None) -> int:
        """SIGKILL every process of ``owner`` (None: of every owner, and the orphans of none) until none is
        left; how many were killed."""
        killed: set[int] = set()
        with self._lock:
            for _ in range(KILL_ROUNDS):
                self._walk()
                found = self._owned.get(owner, []) if owner is not None else \
                    [pid for pids in self._owned.values() for pid in pids]
                alive = [pid for pid in found if _alive(pid)]
                if not alive:
                    break
                for pid in alive:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        continue
                    killed.add(pid)
                _wait_dead(alive)
            else:
                log.warning("processes started by %s kept appearing after %d rounds of killing them",
                            owner or "the jobs", KILL_ROUNDS)
            self._reap(killed)
        if killed:
            log.info("killed %d process(es) started by %s", len(killed), owner or "the jobs and kernels")
        return len(killed)

    # -- walking -------------------------------------------------------------------------

    def _walk(self) -> None:
        children = self._children_reader()
        owned: dict[str, list[int]] = {}
        seen: dict[int, str] = {}
        adopted: list[int] = []
        pending = []
        for pid in children(self._me):
            owner = self._roots.get(pid)
            if owner is None:
                adopted.append(pid)
                owner = self._seen[pid] if pid in self._seen else \
                    _owner_mark(pid, self._me) or ("" if self.adopting else None)
            if owner is not None:
                pending.append((pid, owner))
        while pending:
            pid, owner = pending.pop()
            seen[pid] = owner
            owned.setdefault(owner, []).append(pid)
            pending.extend((child, owner) for child in children(pid))
        self._seen, self._owned = seen, owned
        self._walked_at = time.monotonic()
        if self.adopting:
            self._reap(adopted)

    def _children_reader(self) -> Children:
        if self._children_files:
            return _children_from_files
        by_parent: dict[int, list[int]] = {}
        for pid, parent in _parents().items():
            by_parent.setdefault(parent, []).append(pid)
        return lambda pid: by_parent.get(pid, [])

    def _reap(self, pids: Iterable[int]) -> None:
        """Collect the exit status of adopted children that ended (never of a root: its Popen does that)."""
        for pid in pids:
            if pid in self._roots:
                continue
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # not ours (yet): its own parent reaps it, or it is gone
                continue


@functools.cache
def tree() -> ProcessTree:
    """This process's one ProcessTree: the subreaper setting and the adopted orphans are per process."""
    return ProcessTree()


def _children_from_files(pid: int) -> list[int]:
    found: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for thread in threads:  # a child's parent is the thread that forked it
        try:
            with open(f"/proc/{pid}/task/{thread}/children", "rb") as file:
                found.extend(int(child) for child in file.read().split())
        except OSError:
            continue
    return found


def _parents() -> dict[int, int]:
    """Every process's parent: from /proc/*/stat where there is one, else from psutil."""
    if not LINUX:
        return {p.pid: p.info["ppid"] for p in psutil.process_iter(["ppid"]) if p.info["ppid"] is not None}
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := _stat(int(name))) is not None:
            parents[int(name)] = int(stat[1])
    return parents


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name: state, ppid, ...; None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            return file.read().rpartition(b")")[2].decode().split()
    except OSError:
        return None


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for its parent."""
    if LINUX:
        stat = _stat(pid)
        return stat is not None and stat[0] not in ("Z", "X")
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _wait_dead(pids: list[int]) -> None:
    deadline = time.monotonic() + DEATH_WAIT_S
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(POLL_S)  # polling the kernel's process table, bounded by the deadline


def _rss(pid: int) -> int:
    if LINUX:
        try:
            with open(f"/proc/{pid}/statm", "rb") as file:
                return int(file.read().split()[1]) * PAGE_BYTES
        except (OSError, IndexError, ValueError):
            return 0
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return 0


def _owner_mark(pid: int, worker: int) -> str | None:
    """The owner a process's environment names, when it names this worker."""
    prefix = f"{OWNER_ENV}={worker}/".encode()
    try:
        if LINUX:
            with open(f"/proc/{pid}/environ", "rb") as file:
                entries = file.read().split(b"\0")
        else:
            entries = [f"{k}={v}".encode() for k, v in psutil.Process(pid).environ().items()]
    except (OSError, psutil.Error):
        return None
    return next((entry[len(prefix):].decode(errors="replace") for entry in entries if entry.startswith(prefix)), None)
