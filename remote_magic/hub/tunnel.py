"""A public TCP address for a local port, through ngrok's official Python SDK.

``open_tcp_tunnel(port)`` opens an ngrok session, asks it for a TCP endpoint that forwards to
``127.0.0.1:port`` and returns a :class:`Tunnel` whose ``public_address`` (``tcp://HOST:PORT``)
goes into the token a worker prints. ``remote-worker --ngrok`` and ``%offload_serve --ngrok`` use
it; ``--advertise tcp://HOST:PORT`` is the way around it for users who forward a port themselves.

Every way opening a tunnel fails becomes a :class:`~remote_magic.errors.TunnelError` whose message
says what to do: no auth token, an account ngrok does not let open TCP endpoints, a rejected auth
token, ngrok's service out of reach (or silent past ``timeout``), and the ``ngrok`` package missing.
The SDK reports its own failures as ``ValueError(context, message[, "ERR_NGROK_<n>"])``;
:func:`translate_sdk_error` turns those into messages. The auth token never reaches a log line or
an error message: ngrok echoes it back in some of its errors, so those are redacted.

The SDK's calls are coroutines bound to a running asyncio loop, while its forwarding runs on its own
(Rust) threads. Each call here runs in a short-lived loop on a helper thread, so the API is
synchronous and works the same from a script and from inside a Jupyter kernel, whose thread
already runs a loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
import time
from typing import Any, Awaitable, Callable, TypeVar

from .._version import __version__
from ..errors import TunnelError

log = logging.getLogger(__name__)

T = TypeVar("T")

AUTHTOKEN_ENV = "NGROK_AUTHTOKEN"
AUTHTOKEN_URL = "https://dashboard.ngrok.com/get-started/your-authtoken"
CARD_URL = "https://dashboard.ngrok.com/settings#id-verification"
AGENTS_URL = "https://dashboard.ngrok.com/agents"
ERRORS_URL = "https://ngrok.com/docs/errors"
DEFAULT_TIMEOUT_S = 15.0
CLOSE_TIMEOUT_S = 5.0  # closing is an RPC over the session; don't let a dead network stall exit
_JOIN_GRACE_S = CLOSE_TIMEOUT_S + 1.0  # the helper thread's wait past its deadline: cleanup
# After a timeout cancels an SDK call, the SDK's Rust runtime still takes the GIL once to notice.
# If the interpreter is shutting down by then (a CLI that prints the error and exits), that aborts
# the process ("FATAL: exception not rethrown", or a pyo3 panic). A moment's pause, with the GIL
# released, lets it finish first; the SDK offers nothing to wait on instead.
_SDK_CANCEL_GRACE_S = 0.2

# ngrok's error codes (https://ngrok.com/docs/errors), grouped by what the user does about them.
TCP_NOT_ALLOWED_CODES = frozenset({
    "ERR_NGROK_8013",  # free account without a card on file: TCP endpoints need one
    "ERR_NGROK_302",   # TCP tunnels are only available to registered users
    "ERR_NGROK_7102",  # account not authorized to use TCP address backends
})
BAD_TOKEN_CODES = {
    "ERR_NGROK_105": "does not look like an ngrok auth token",
    "ERR_NGROK_106": "is an old (ngrok v1) auth token",
    "ERR_NGROK_107": "is not valid any more (it was reset, revoked, or belongs to a team you left)",
}
NO_TOKEN_CODES = frozenset({"ERR_NGROK_4018"})  # the session carried no credential
SESSION_LIMIT_CODES = frozenset({"ERR_NGROK_108"})  # too many agent sessions at once

_CODE = re.compile(r"ERR_NGROK_\d+")
_URLS = {"tcp": re.compile(r"^tcp://[^:/\s]+:\d+$"), "http": re.compile(r"^https://[^/\s]+/?$")}
_SESSION_CONTEXT = "failed to connect session"  # the SDK's first ValueError argument for connect

_ALTERNATIVE = ("or skip ngrok: forward the port yourself (ssh -R, Tailscale, cloudflared, a "
                "router's port forward) and pass --advertise tcp://HOST:PORT")


class Tunnel:
    """An open ngrok TCP tunnel to a local port; close it (or use ``with``) to end it.

    ``public_address`` is ``tcp://HOST:PORT``, usable as a ZeroMQ endpoint; ``local_port`` is the
    port on 127.0.0.1 that connections to it reach.
    """

    public_address: str
    local_port: int

    def __init__(self, public_address: str, local_port: int, session: Any, listener: Any,
                 closing: threading.Event) -> None:
        self.public_address = public_address
        self.local_port = local_port
        self._session = session
        self._listener = listener
        self._closing = closing
        self._lock = threading.Lock()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closing.is_set()

    def close(self) -> None:
        """End the tunnel and its ngrok session; calling it again does nothing.

        A failure to close cleanly (the network is gone, say) is logged, not raised: ngrok drops
        the endpoint when the session stops answering, and the session ends with this process.
        """
        with self._lock:
            if self._closing.is_set():
                return
            self._closing.set()
            listener, session = self._listener, self._session
            self._listener = self._session = None
        try:
            _run_in_loop(lambda: _close_async(listener, session), CLOSE_TIMEOUT_S)
        except Exception as exc:
            log.warning("Could not close the ngrok tunnel %s cleanly (%s); ngrok drops it when "
                        "this process exits", self.public_address, _describe(exc))
        else:
            log.info("Closed ngrok tunnel %s", self.public_address)

    def https_endpoint(self, local_port: int, timeout: float = DEFAULT_TIMEOUT_S) -> Tunnel:
        """An HTTPS endpoint to ``http://127.0.0.1:local_port`` on this tunnel's ngrok session: a free ngrok
        account has one session at a time. Closing it leaves this tunnel open; closing this one ends both."""
        session = self._session
        if session is None:
            raise TunnelError("the ngrok tunnel is closed; open a new one")
        forward_to = f"http://127.0.0.1:{local_port}"
        try:
            listener = _run_in_loop(
                lambda: asyncio.wait_for(session.http_endpoint().listen_and_forward(forward_to), timeout), timeout)
        except Exception as exc:  # the SDK raises ValueError; a timeout is asyncio.TimeoutError
            raise translate_sdk_error(exc, timeout=timeout) from exc
        return _checked(Tunnel(str(listener.url()), local_port, None, listener, threading.Event()), "http")

    def __enter__(self) -> Tunnel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<Tunnel {self.public_address} -> 127.0.0.1:{self.local_port} ({state})>"


def open_tcp_tunnel(local_port: int, *, authtoken: str | None = None,
                    timeout: float = DEFAULT_TIMEOUT_S) -> Tunnel:
    """Open an ngrok TCP endpoint that forwards to ``127.0.0.1:local_port``.

    ``open_https_tunnel`` takes the same arguments and opens an HTTPS endpoint, with a certificate
    browsers trust, for a local HTTP server (the page of ``remote-worker --browser``).

    Parameters:
        local_port: the port a local server (the hub) listens on, on 127.0.0.1 or 0.0.0.0.
        authtoken: the ngrok auth token; defaults to the ``NGROK_AUTHTOKEN`` environment variable.
        timeout: seconds to wait, in all, for ngrok's service to open the session and endpoint.

    Returns an open :class:`Tunnel`. Raises :class:`~remote_magic.errors.TunnelError`, with a
    message that says what to do, if the tunnel cannot be opened; ``ValueError`` for a port
    outside 1-65535 or a timeout that is not positive.
    """
    return _open_tunnel("tcp", local_port, authtoken, timeout)


def open_https_tunnel(local_port: int, *, authtoken: str | None = None,
                      timeout: float = DEFAULT_TIMEOUT_S) -> Tunnel:
    """An ngrok HTTPS endpoint (``https://…``) that forwards to ``http://127.0.0.1:local_port``; see
    :func:`open_tcp_tunnel`."""
    return _open_tunnel("http", local_port, authtoken, timeout)


def _open_tunnel(kind: str, local_port: int, authtoken: str | None, timeout: float) -> Tunnel:
    if isinstance(local_port, bool) or not isinstance(local_port, int) or not 0 < local_port < 65536:
        raise ValueError(f"local_port must be a port number from 1 to 65535, not {local_port!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
    token = _resolve_authtoken(authtoken)
    ngrok = _import_sdk()
    forward_to = f"{kind}://127.0.0.1:{local_port}"
    closing = threading.Event()
    log.info("Opening an ngrok %s tunnel to %s (timeout %g s)", kind.upper(), forward_to, timeout)
    try:
        builder = (ngrok.SessionBuilder()
                   .authtoken(token)
                   .client_info("remote-magic", __version__)
                   .handle_disconnection(_disconnection_logger(closing)))
        if _server_addr is not None:
            builder = builder.server_addr(_server_addr)
        deadline = time.monotonic() + timeout
        session, listener = _run_in_loop(lambda: _open_async(builder, kind, forward_to, deadline), timeout)
    except Exception as exc:  # the SDK raises ValueError; a timeout is asyncio.TimeoutError
        raise translate_sdk_error(exc, authtoken=token, timeout=timeout) from exc
    return _checked(Tunnel(str(listener.url()), local_port, session, listener, closing), kind)


def _checked(tunnel: Tunnel, kind: str) -> Tunnel:
    """``tunnel``, if ngrok gave it the kind of address asked for (else it is closed, and TunnelError)."""
    if not _URLS[kind].match(tunnel.public_address):
        tunnel.close()
        raise TunnelError(f"ngrok opened an endpoint at {tunnel.public_address!r}, which is not "
                          f"{'a tcp://HOST:PORT' if kind == 'tcp' else 'an https://'} address; {_ALTERNATIVE}.")
    log.info("ngrok tunnel %s -> 127.0.0.1:%d is open", tunnel.public_address, tunnel.local_port)
    return tunnel


def translate_sdk_error(exc: BaseException, *, authtoken: str | None = None,
                        timeout: float = DEFAULT_TIMEOUT_S) -> TunnelError:
    """The :class:`TunnelError` for an exception the ngrok SDK raised (or a timeout waiting on it).

    The SDK raises ``ValueError(context, message)``, with ngrok's error code as a third argument
    when ngrok's service refused something. ``authtoken`` is redacted from any text of ngrok's
    that the message repeats.
    """
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return TunnelError(
            f"ngrok's service did not answer within {timeout:g} s. Check this machine's internet "
            f"connection (the ngrok agent connects out to connect.ngrok-agent.com on port 443; a "
            f"firewall or proxy may block it) and try again, {_ALTERNATIVE}.")
    parts = [str(a) for a in exc.args] if exc.args else [str(exc)]
    code = next((m.group(0) for p in parts for m in [_CODE.search(p)] if m), None)
    context = parts[0]
    detail = _redact(parts[1] if len(parts) > 1 else parts[0], authtoken)
    if code in TCP_NOT_ALLOWED_CODES:
        return TunnelError(
            f"ngrok will not open a TCP endpoint for this account ({code}): ngrok's free plan allows "
            f"TCP endpoints only once the account is verified with a credit or debit card on file "
            f"(it is not charged). Add one at {CARD_URL} and try again, {_ALTERNATIVE}.")
    if code in BAD_TOKEN_CODES:
        return TunnelError(
            f"ngrok rejected the auth token ({code}): it {BAD_TOKEN_CODES[code]}. Copy your current "
            f"token from {AUTHTOKEN_URL} into {AUTHTOKEN_ENV}{_IN_A_NOTEBOOK}.")
    if code in NO_TOKEN_CODES:
        return _no_token_error(f"ngrok's service received no auth token ({code})")
    if code in SESSION_LIMIT_CODES:
        return TunnelError(
            f"ngrok refused another agent session for this account ({code}; the free plan allows "
            f"one at a time). Stop the other one (another `remote-worker --ngrok`, "
            f"`%offload_serve --ngrok`, or an `ngrok` command; see {AGENTS_URL}) and try again, "
            f"{_ALTERNATIVE}.")
    if code is not None:
        return TunnelError(f"ngrok refused the tunnel ({code}): {detail} "
                           f"(see {ERRORS_URL}/{code.lower()}); {_ALTERNATIVE}.")
    if context.startswith(_SESSION_CONTEXT):
        return TunnelError(
            f"Could not reach ngrok's service ({detail}). Check this machine's internet connection "
            f"(the ngrok agent connects out to connect.ngrok-agent.com on port 443; a firewall or "
            f"proxy may block it) and try again, {_ALTERNATIVE}.")
    return TunnelError(f"Could not open the ngrok tunnel: {_redact(': '.join(parts), authtoken)}; "
                       f"{_ALTERNATIVE}.")


# Test seam: the address of ngrok's agent ingress; None means the SDK's default
# (connect.ngrok-agent.com:443). Tests point it at loopback ports to exercise the SDK offline.
_server_addr: str | None = None


def _resolve_authtoken(authtoken: str | None) -> str:
    source = "%offload_serve --ngrok-authtoken" if authtoken else AUTHTOKEN_ENV
    token = (authtoken or os.environ.get(AUTHTOKEN_ENV, "")).strip()
    if not token:
        raise _no_token_error("No ngrok auth token")
    log.debug("Using the ngrok auth token from %s", source)
    return token


_IN_A_NOTEBOOK = (" in the environment (remote-worker refuses it on the command line, where `ps` shows it to "
                  "every user; in a notebook, %offload_serve --ngrok-authtoken also takes it)")


def _no_token_error(what: str) -> TunnelError:
    return TunnelError(
        f"{what}: set {AUTHTOKEN_ENV}{_IN_A_NOTEBOOK}. Get a token (a free ngrok "
        f"account) at {AUTHTOKEN_URL}; {_ALTERNATIVE}.")


def _import_sdk() -> Any:
    try:
        import ngrok
    except ImportError as exc:
        raise TunnelError(
            f"The ngrok package is not installed or does not load on this platform ({exc}). Run "
            f"`pip install ngrok`, {_ALTERNATIVE}.") from exc
    return ngrok


def _redact(text: str, authtoken: str | None) -> str:
    return text.replace(authtoken, "<auth token>") if authtoken else text


def _describe(exc: BaseException) -> str:
    return ": ".join(str(a) for a in exc.args) if exc.args else type(exc).__name__


def _disconnection_logger(closing: threading.Event) -> Callable[[str, str], None]:
    """A handler the SDK calls (on its own thread) each time the session reconnects."""

    def on_disconnection(addr: str, error: str) -> None:
        if not closing.is_set():
            log.warning("The ngrok session lost its connection to %s (%s); reconnecting", addr, error)

    return on_disconnection


def _remaining(deadline: float) -> float:
    return max(deadline - time.monotonic(), 0.0)


async def _open_async(builder: Any, kind: str, forward_to: str, deadline: float) -> tuple[Any, Any]:
    session = await asyncio.wait_for(builder.connect(), _remaining(deadline))
    try:
        endpoint = session.tcp_endpoint() if kind == "tcp" else session.http_endpoint()
        listener = await asyncio.wait_for(endpoint.listen_and_forward(forward_to), _remaining(deadline))
    except BaseException:
        try:
            await _close_async(None, session)
        except Exception as exc:
            log.debug("Closing the ngrok session after a failed open: %s", _describe(exc))
        raise
    return session, listener


async def _close_async(listener: Any, session: Any) -> None:
    try:
        if listener is not None:
            await asyncio.wait_for(listener.close(), CLOSE_TIMEOUT_S)
    finally:
        if session is not None:
            await asyncio.wait_for(session.close(), CLOSE_TIMEOUT_S)


def _run_in_loop(make: Callable[[], Awaitable[T]], timeout: float) -> T:
    """Run ``make()`` to completion in a fresh event loop on a helper thread.

    ``make`` is called inside that loop: the SDK binds its awaitables to the loop running when
    they are created. ``timeout`` bounds the wait for the thread; the coroutine bounds itself.
    """
    outcome: list[tuple[bool, Any]] = []

    async def main() -> T:
        try:
            return await make()
        except asyncio.TimeoutError:
            await asyncio.sleep(_SDK_CANCEL_GRACE_S)
            raise

    def target() -> None:
        try:
            outcome.append((True, asyncio.run(main())))
        except BaseException as exc:  # handed to the calling thread below
            outcome.append((False, exc))

    thread = threading.Thread(target=target, name="remote-magic-ngrok", daemon=True)
    thread.start()
    thread.join(timeout + _JOIN_GRACE_S)
    if not outcome:
        raise asyncio.TimeoutError()
    ok, value = outcome[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]
