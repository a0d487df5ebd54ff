"""The wheel of exactly the remote-magic this worker runs, served over HTTP for the notebook to install.

remote-magic isn't on the package index, so a notebook (Colab after each runtime reset) installs it from
the worker: ``remote-worker`` packs the files it runs into a wheel, whether it was installed from a wheel, a
clone or an editable clone (the package's folders as Python finds them, with the installed distribution's
metadata and entry points, at this version), serves it on its own port beside the hub (and through ngrok's
HTTPS with ``--ngrok``), and prints ``%pip install URL#sha256=…`` above the token. pip checks the file
against that hash, so the notebook gets this content or an error, never another copy. The wheel's version is
this one with a local label of its files' digest (``0.1.0+3f9a…``): pip keeps a copy installed at the same
version, so without it a notebook that installed another build of 0.1.0 would keep that one, silently.

Packing takes a fraction of a second and needs no network or build backend; it is done once per start.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.metadata
import importlib.util
import io
import logging
import re
import threading
import zipfile
from concurrent.futures import Future, TimeoutError as PackTimeout
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

from remote_magic._version import __version__
from remote_magic.wire.install import SERVED_WHEEL_GENERATOR

if TYPE_CHECKING:
    from remote_magic.hub.tunnel import Tunnel

log = logging.getLogger(__name__)

DISTRIBUTION = "remote-magic"
# The import packages whose folders may lie apart (an editable install maps them to a clone's top-level
# folders); in a wheel install they are all inside remote_magic/. tests/end_to_end/test_wheel.py compares this
# wheel with the one pip builds, so a package missing here (or a file type below) fails there.
PACKAGES = ("remote_magic", "remote_magic.worker", "remote_magic.shaders", "remote_magic.kernel_provider")
# What a wheel built from pyproject.toml ships: modules and the package data it declares.
SHIPPED_SUFFIXES = (".py", ".wgsl", ".html", ".js")
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # the same files give the same bytes, so the same hash
WHEEL_TAG = "py3-none-any"
STOP_POLL_S = 0.1  # how often the server looks whether it is asked to stop: remote-worker stops this fast
PACK_TIMEOUT_S = 60.0  # a request waits this long for the packing (a fraction of a second as a rule)
MAX_CONNECTIONS = 16
"""Connections served at once; one more is closed unanswered (each holds a thread)."""
IDLE_TIMEOUT_S = 30.0
"""A connection that sends or takes nothing for this long is closed."""


@dataclass(frozen=True)
class OwnWheel:
    """A built wheel: its file name (``remote_magic-0.1.0+3f9a…-py3-none-any.whl``), bytes and their sha256
    (hex)."""

    name: str
    data: bytes
    sha256: str


def package_files() -> dict[str, Path]:
    """The files of this remote-magic as Python imports them, by their path inside a wheel."""
    files: dict[str, Path] = {}
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError(f"can't find the package {package} this worker runs")
        root = Path(next(iter(spec.submodule_search_locations)))
        prefix = package.replace(".", "/")
        for path in sorted(root.rglob("*")):
            relative = path.relative_to(root)
            if (path.is_file() and path.suffix in SHIPPED_SUFFIXES and "__pycache__" not in relative.parts
                    and not any(part.startswith(".") for part in relative.parts)):
                files.setdefault(f"{prefix}/{relative.as_posix()}", path)
    return files


def build_own_wheel() -> OwnWheel:
    """Pack the remote-magic this process runs into a wheel (PEP 427: METADATA, WHEEL, entry points, RECORD)."""
    contents = {arcname: path.read_bytes() for arcname, path in package_files().items()}
    metadata, entry_points = _distribution_texts()
    version = build_version(contents, entry_points)
    name = f"remote_magic-{version}-{WHEEL_TAG}.whl"
    dist_info = f"remote_magic-{version}.dist-info"
    contents[f"{dist_info}/METADATA"] = _with_version(metadata, version).encode()
    if entry_points:
        contents[f"{dist_info}/entry_points.txt"] = entry_points.encode()
    contents[f"{dist_info}/WHEEL"] = (f"Wheel-Version: 1.0\n{SERVED_WHEEL_GENERATOR}\nRoot-Is-Purelib: true\n"
                                      f"Tag: {WHEEL_TAG}\n").encode()
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for arcname, data in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        writer.writerow([arcname, f"sha256={digest}", len(data)])
    writer.writerow([f"{dist_info}/RECORD", "", ""])
    contents[f"{dist_info}/RECORD"] = record.getvalue().encode()

    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as archive:
        for arcname, data in contents.items():  # the packages first, the .dist-info last, as the spec advises
            info = zipfile.ZipInfo(arcname, _FIXED_TIME)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    data = packed.getvalue()
    return OwnWheel(name, data, hashlib.sha256(data).hexdigest())


def build_version(files: dict[str, bytes], entry_points: str) -> str:
    """This version with a local label (PEP 440) of the files' digest: another build gets another version."""
    digest = hashlib.sha256(entry_points.encode())
    for arcname in sorted(files):
        digest.update(f"\0{arcname}\0{len(files[arcname])}\0".encode())
        digest.update(files[arcname])
    return f"{__version__}{'.' if '+' in __version__ else '+'}{digest.hexdigest()[:12]}"


def _distribution_texts() -> tuple[str, str]:
    """This distribution's METADATA and entry_points.txt."""
    candidates = list(importlib.metadata.distributions(name=DISTRIBUTION))
    # A clone's root may hold a build's stale remote_magic.egg-info (first on the path when it is the working
    # directory): prefer pip's record of the installed copy.
    candidates.sort(key=lambda d: d.read_text("METADATA") is None)
    for distribution in candidates:
        metadata = distribution.read_text("METADATA") or distribution.read_text("PKG-INFO")
        if metadata:
            return metadata, distribution.read_text("entry_points.txt") or ""
    log.warning("no installed metadata for %s: the served wheel carries its name and version only, and "
                "installs without dependencies", DISTRIBUTION)
    return f"Metadata-Version: 2.1\nName: {DISTRIBUTION}\nVersion: {__version__}\n", ""


def _with_version(metadata: str, version: str) -> str:
    # Also where an editable install's metadata, written when it was installed, names an older version.
    return re.sub(r"^Version: .*$", f"Version: {version}", metadata, count=1, flags=re.MULTILINE)


class _BoundedServer(ThreadingHTTPServer):
    """At most ``MAX_CONNECTIONS`` at once, each closed after ``IDLE_TIMEOUT_S`` without a byte either way."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._admitted: set[object] = set()

    def verify_request(self, request: Any, client_address: Any) -> bool:
        if not self._slots.acquire(blocking=False):
            log.warning("%d connections for the wheel already: one more from %s closed", MAX_CONNECTIONS,
                        client_address[0])
            return False
        self._admitted.add(request)
        return True

    def shutdown_request(self, request: Any) -> None:
        super().shutdown_request(request)
        try:
            self._admitted.remove(request)  # (also called for a request verify_request refused)
        except KeyError:
            return
        self._slots.release()


class WheelServer:
    """Serves one wheel at ``/<its file name>`` over HTTP on ``host:port`` (port 0: any free one), once
    ``wheel`` holds it."""

    def __init__(self, wheel: Future[OwnWheel], host: str, port: int = 0) -> None:
        self._server = _BoundedServer((host, port), _handler_for(wheel))
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, args=(STOP_POLL_S,),
                                        name="remote-magic-own-wheel", daemon=True)
        self._thread.start()
        log.info("serving the notebook side's wheel on %s:%d", host, self.port)

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def _handler_for(packed: Future[OwnWheel]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = IDLE_TIMEOUT_S

        def do_GET(self) -> None:
            self._answer(body=True)

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def _answer(self, body: bool) -> None:
            try:
                wheel = packed.result(PACK_TIMEOUT_S)
            except PackTimeout:
                self.send_error(503, "remote-worker is still packing its wheel: try again")
                return
            except Exception as exc:  # install_line() said it where remote-worker printed the notebook's lines
                self.send_error(503, f"remote-worker could not pack its wheel: {exc}")
                return
            found = self.path.split("?", 1)[0] == f"/{wheel.name}"
            data = wheel.data if found else (f"remote-worker serves only /{wheel.name}\n").encode()
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "application/octet-stream" if found else "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")  # the next start may serve other code at this name
            self.end_headers()
            if body:
                self.wfile.write(data)
            if found:
                log.info("sent %s to %s", wheel.name, self.client_address[0])

        def log_message(self, format: str, *args: object) -> None:
            log.debug("%s: " + format, self.client_address[0], *args)

    return Handler


class ServedWheel:
    """The wheel served beside the hub, and the ``%pip install`` line remote-worker prints for it.

    The wheel is packed on a thread while the worker starts; the server listens at once and answers once it
    is packed. The URL names the token's host (``hub_host``) and the server's port, or after
    :meth:`expose_through` an HTTPS endpoint on the hub tunnel's ngrok session.
    """

    def __init__(self, listen_host: str, hub_host: str, advertised: bool = False) -> None:
        self._packed: Future[OwnWheel] = Future()
        threading.Thread(target=self._pack, name="remote-magic-pack-wheel", daemon=True).start()
        self.server = WheelServer(self._packed, listen_host)
        self.tunnel: Tunnel | None = None
        self.problem = ""
        self.advertised = advertised
        self.base = f"http://{_url_host(hub_host)}:{self.server.port}"

    def expose_through(self, hub_tunnel: Tunnel) -> None:
        """Serve it through an HTTPS endpoint on the hub tunnel's ngrok session (a free account has one session
        at a time). Where ngrok refuses one (an account allowed fewer endpoints or domains than the hub's, the
        ``--browser`` page's and this one), :meth:`reach` says so, and the worker runs on without the line."""
        from remote_magic.errors import TunnelError

        try:
            self.tunnel = hub_tunnel.https_endpoint(self.server.port)
        except TunnelError as exc:
            self._cannot(f"can't be served through ngrok ({exc})")
        else:
            self.base = self.tunnel.public_address

    def _pack(self) -> None:
        try:
            self._packed.set_result(build_own_wheel())
        except Exception as exc:  # handed to whoever waits for the wheel: install_line() says it
            self._packed.set_exception(exc)

    def _cannot(self, why: str) -> None:
        self.problem = (f"the notebook side's wheel {why}. Install remote-magic {__version__} in the notebook "
                        "another way: a wheel you build in a clone of it (`pip wheel --no-deps -w dist .`) and "
                        "upload, or its git URL")
        log.info("%s", self.problem)  # reach() says it where remote-worker prints the notebook's lines

    @property
    def url(self) -> str:
        """The wheel's URL, with its sha256 for pip to check (waits for the packing)."""
        wheel = self._packed.result(PACK_TIMEOUT_S)
        return f"{self.base}/{wheel.name}#sha256={wheel.sha256}"

    def install_line(self) -> str:
        """``%pip install URL``, the first line to run in the notebook; empty when it can't be served."""
        if not self.problem:
            try:
                return f"%pip install {self.url}"
            except PackTimeout:
                self._cannot(f"was not packed within {PACK_TIMEOUT_S:g} s")
            except Exception as exc:  # what packing raised (an unreadable file, say): the worker runs on without it
                self._cannot(f"could not be packed ({exc})")
        return ""

    def reach(self) -> str:
        """Who can fetch it, in words, for remote-worker to print under the token's."""
        if self.problem:
            return self.problem
        what = f"`%pip install` fetches the remote-magic this worker runs ({__version__})"
        if self.tunnel is not None:
            return f"{what} through the ngrok tunnel's HTTPS: notebooks anywhere reach it"
        if self.advertised:
            return (f"{what} from port {self.server.port} of this machine: forward it too, as you did the hub's "
                    "port (--advertise), or the notebook can't fetch it")
        return (f"{what} from port {self.server.port} of the token's host: notebooks that reach the token's "
                "address reach it, unless a firewall lets only the hub's port in")

    def close(self) -> None:
        """Stop serving, and close the HTTPS endpoint (the hub's tunnel stays open)."""
        if self.tunnel is not None:
            self.tunnel.close()
        self.server.close()


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
