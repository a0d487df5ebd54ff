"""``RemoteKernelProvisioner``: jupyter_client starts, signals and stops a kernel that runs on a worker.

Registered as ``remote-magic-provisioner`` under the ``jupyter_client.kernel_provisioners`` entry point;
a kernelspec names it (``remote-worker kernelspec install`` writes one). The Jupyter side connects to
five ports on 127.0.0.1 as for a local kernel; behind them a relay process
(``remote_magic.kernel_provider.relay``) carries each channel over the hub's one CurveZMQ port to the
worker, which runs the ipykernel. The relay is the process this provisioner watches: it lives as long
as the remote kernel, and exits with its status.

Settings (``metadata.kernel_provisioner.config`` in kernel.json, traitlets):
``worker`` (a worker's name; default: the hub picks one), ``token_env`` (the environment variable
holding the client token, default ``REMOTE_MAGIC_TOKEN``), ``token_file`` (a file holding it instead),
``token`` (the token itself, only when the kernelspec was installed with ``--store-token``),
``share_token`` (also give the kernel the token, in its ``$REMOTE_MAGIC_TOKEN``, so ``%offload_connect``
inside it reaches the same hub and its other workers), ``start_timeout`` (seconds). The kernelspec's
``env`` applies to the kernel, on the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from jupyter_client.connect import KernelConnectionInfo, LocalPortCache
from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase
from traitlets import Bool, Float, Unicode

from remote_magic.errors import KernelError, TokenError
from remote_magic.wire.failures import error_from_header

PROVISIONER_NAME = "remote-magic-provisioner"
DEFAULT_TOKEN_ENV = "REMOTE_MAGIC_TOKEN"
RELAY_MODULE = "remote_magic.kernel_provider.relay"
REMOTE_ENV = "REMOTE_MAGIC_KERNEL_ENV"
"""How the relay learns the environment variables the kernel gets on the worker (JSON)."""
EXIT_WAIT_S = 3.0
"""After a stop command, how long the relay may take to exit before it is killed here."""


class RemoteKernelProvisioner(KernelProvisionerBase):
    """Runs the kernel on a remote-magic worker; the Jupyter client sees a local kernel."""

    worker = Unicode("", config=True, help="the worker to run kernels on (default: the hub picks one)")
    token_env = Unicode(DEFAULT_TOKEN_ENV, config=True, help="the environment variable holding the client token")
    token_file = Unicode("", config=True, help="a file holding the client token (read at each start)")
    token = Unicode("", config=True, help="the client token itself (only if the kernelspec stores it)")
    share_token = Bool(False, config=True, help="give the kernel the token too ($REMOTE_MAGIC_TOKEN on the worker)")
    start_timeout = Float(60.0, config=True, help="seconds the kernel may take to start on the worker")

    process: subprocess.Popen[bytes] | None = None
    pid: int | None = None  # the relay's, also after load_provisioner_info
    ports_cached = False
    remote: dict[str, Any] = {}  # what the worker said at start: pid, python, worker

    @property
    def has_process(self) -> bool:
        return self.process is not None or (self.pid is not None and _alive(self.pid))

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """Pick five free local ports, write the connection file, and build the relay's command."""
        km = self.parent
        if km is None:
            raise KernelError("the remote-magic provisioner needs a KernelManager as its parent")
        if km.transport != "tcp":
            raise KernelError(f"the remote-magic provisioner relays tcp channels, not {km.transport!r}")
        km.ip = "127.0.0.1"  # the relay listens on this machine's loopback only
        kwargs.pop("extra_arguments", None)
        kwargs.pop("transport_encryption", None)
        if km.cache_ports and not self.ports_cached:
            lpc = LocalPortCache.instance()
            km.shell_port, km.iopub_port, km.stdin_port, km.hb_port, km.control_port = (
                lpc.find_available_port(km.ip) for _ in range(5))
            self.ports_cached = True
        km.write_connection_file()
        self.connection_info = km.get_connection_info()
        cmd = [sys.executable, "-m", RELAY_MODULE, "--connection-file", km.connection_file,
               "--kernel-id", str(self.kernel_id), "--start-timeout", str(self.start_timeout)]
        worker = self.worker or self.remote.get("worker")  # a restart stays on the same worker
        if worker:
            cmd += ["--worker", str(worker)]
        result: dict[str, Any] = await super().pre_launch(cmd=cmd, **kwargs)
        return result

    def _read_token(self) -> str:
        if self.token:
            return str(self.token).strip()
        if self.token_file:
            path = Path(str(self.token_file)).expanduser()
            try:
                return path.read_text().strip()
            except OSError as exc:
                raise TokenError(f"can't read the remote-magic token from {path}: {exc.strerror}") from None
        value = os.environ.get(str(self.token_env), "").strip()
        if not value:
            raise TokenError(f"no remote-magic token: set ${self.token_env} to the line remote-worker printed "
                             "(rmc1.…) before starting Jupyter, or reinstall the kernelspec with --token-file")
        return value

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        """Start the relay and wait until the worker runs the kernel; raises what went wrong."""
        env = dict(kwargs.get("env") or os.environ)
        token = self._read_token()
        remote_env = {name: env[name] for name in (self.kernel_spec.env if self.kernel_spec else {}) if name in env}
        if self.share_token:
            remote_env[DEFAULT_TOKEN_ENV] = token
        env[DEFAULT_TOKEN_ENV] = token
        env[REMOTE_ENV] = json.dumps(remote_env)
        self.process = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                        cwd=kwargs.get("cwd"), start_new_session=True)
        self.pid = self.process.pid
        assert self.process.stdout is not None
        loop = asyncio.get_running_loop()
        try:
            line = await asyncio.wait_for(loop.run_in_executor(None, self.process.stdout.readline),
                                          self.start_timeout + 15)
        except asyncio.TimeoutError:
            line = b""
        try:
            report = json.loads(line) if line.strip() else {
                "error": KernelError.__name__, "message": "the kernel relay ended without saying why (see the log)"}
        except ValueError:
            report = {"error": KernelError.__name__, "message": f"the kernel relay said {line[:200]!r}"}
        if "started" not in report:
            await self._reap()
            error = error_from_header(report)
            raise (error if isinstance(error, (KernelError, TokenError)) else
                   KernelError(f"the kernel did not start on the worker: {error} ({type(error).__name__})"))
        self.remote = dict(report["started"]) if isinstance(report["started"], dict) else {}
        self.log.info("kernel %s runs on worker %r (pid %s there); if this notebook's link to it stays down "
                      "past the heartbeat bound, the worker kills it %s s later", self.kernel_id,
                      self.remote.get("worker"), self.remote.get("pid"), self.remote.get("orphan_grace_s", "?"))
        return self.connection_info

    async def _reap(self) -> None:
        if self.process is not None:
            try:
                await asyncio.wait_for(self.wait(), EXIT_WAIT_S)
            except asyncio.TimeoutError:
                self.process.kill()
                await self.wait()

    def _command(self, line: str) -> bool:
        """Tell the relay; False when there is no pipe to it (a provisioner loaded from saved info)."""
        if self.process is None or self.process.stdin is None or self.process.stdin.closed:
            return False
        try:
            self.process.stdin.write(line.encode() + b"\n")
            self.process.stdin.flush()
        except (BrokenPipeError, ValueError):  # it ended already
            pass
        return True

    async def poll(self) -> int | None:
        if self.process is not None:
            return self.process.poll()
        if self.pid is not None and _alive(self.pid):
            return None
        return 0

    async def wait(self) -> int | None:
        while (code := await self.poll()) is None:
            await asyncio.sleep(0.05)
        if self.process is not None:
            self.process.wait()
            for stream in (self.process.stdin, self.process.stdout):
                if stream is not None:
                    with contextlib.suppress(OSError):  # a command it ended before reading stays unflushed
                        stream.close()
            self.process = None
        self.pid = None
        return code

    async def send_signal(self, signum: int) -> None:
        """Deliver ``signum`` to the kernel's process group on the worker (SIGINT: interrupt)."""
        if signum == signal.SIGKILL:
            await self.kill()
        elif signum == signal.SIGTERM:
            await self.terminate()
        elif not self._command(f"signal {signum}") and self.pid is not None and signum == signal.SIGINT:
            os.kill(self.pid, signum)  # the relay passes SIGINT on as an interrupt

    async def kill(self, restart: bool = False) -> None:
        """Kill the kernel on the worker at once (SIGKILL to its process group), then the relay ends."""
        await self._stop("kill")

    async def terminate(self, restart: bool = False) -> None:
        """SIGTERM to the kernel on the worker (killed after a grace period there), then the relay ends."""
        await self._stop("terminate")

    async def _stop(self, how: str) -> None:
        if not self._command(how):
            if self.pid is not None and _alive(self.pid):
                os.kill(self.pid, signal.SIGTERM)  # the relay stops the kernel, then exits
            return
        if how == "kill":  # jupyter_client waits a few seconds after a kill: make sure the relay is gone by then
            assert self.process is not None
            try:
                await asyncio.wait_for(asyncio.shield(self._exited()), EXIT_WAIT_S)
            except asyncio.TimeoutError:
                if self.process is not None:
                    self.process.kill()

    async def _exited(self) -> None:
        while self.process is not None and self.process.poll() is None:
            await asyncio.sleep(0.05)

    async def cleanup(self, restart: bool = False) -> None:
        """Give back the local ports (unless a restart reuses them); the relay is gone by now."""
        if self.process is not None and self.process.poll() is None:
            await self.kill()
            await self._reap()
        if self.ports_cached and not restart:
            lpc = LocalPortCache.instance()
            for name in ("shell_port", "iopub_port", "stdin_port", "hb_port", "control_port"):
                lpc.return_port(int(self.connection_info[name]))  # type: ignore[literal-required,unused-ignore]
            self.ports_cached = False

    async def get_provisioner_info(self) -> dict[str, Any]:
        """What another KernelManager needs to take this kernel over: the relay's pid and the worker's answer."""
        info: dict[str, Any] = await super().get_provisioner_info()
        info.update({"pid": self.pid, "remote": self.remote})
        return info

    async def load_provisioner_info(self, provisioner_info: dict[str, Any]) -> None:
        """The inverse of ``get_provisioner_info``: the relay is then watched and signalled by pid."""
        await super().load_provisioner_info(provisioner_info)
        self.pid = provisioner_info.get("pid")
        self.remote = dict(provisioner_info.get("remote") or {})

    def get_shutdown_wait_time(self, recommended: float = 5.0) -> float:
        return max(recommended, 5.0)  # a shutdown reply crosses the hub twice

    def get_stable_start_time(self, recommended: float = 10.0) -> float:
        return max(recommended, self.start_timeout)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
