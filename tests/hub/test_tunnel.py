"""ngrok tunnels: every way opening one fails gives a TunnelError that says what to do.

ngrok's service cannot be reached from the test machines, so the failures are exercised through
the real ngrok SDK wherever it raises them without network: no token, a service out of reach (the
default address, and a closed loopback port), a service that never answers (a loopback socket that
accepts and stays silent), and calling from inside a running event loop. The refusals that only
ngrok's service can produce (TCP not allowed, bad or revoked token, session limit) are tested
through ``translate_sdk_error`` with the exception the SDK builds from them, and say so. The one
test of a tunnel that really opens needs a token and the network: it runs only when
REMOTE_MAGIC_TEST_NGROK=1 and NGROK_AUTHTOKEN are set.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import threading
import time
from typing import Callable, Iterator

import pytest

from remote_magic import TunnelError
from remote_magic.hub import tunnel as tunnel_module
from remote_magic.hub.tunnel import open_https_tunnel, open_tcp_tunnel, translate_sdk_error

BOGUS_TOKEN = "2bogusTokenForTests_0123456789abcdefghijklmnop"
SHORT_TIMEOUT_S = 1.5
ADVERTISE_HINT = "--advertise tcp://HOST:PORT"
# Read before the autouse fixture below clears NGROK_AUTHTOKEN for every test.
REAL_TOKEN = os.environ.get("NGROK_AUTHTOKEN", "") if os.environ.get("REMOTE_MAGIC_TEST_NGROK") == "1" else ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(autouse=True)
def no_env_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests choose their token explicitly; a developer's own NGROK_AUTHTOKEN must not leak in."""
    monkeypatch.delenv("NGROK_AUTHTOKEN", raising=False)


@pytest.fixture
def refused_service(monkeypatch: pytest.MonkeyPatch) -> str:
    """Point the SDK at a loopback port nobody listens on: a service that cannot be reached."""
    address = f"127.0.0.1:{_free_port()}"
    monkeypatch.setattr(tunnel_module, "_server_addr", address)
    return address


@pytest.fixture
def silent_service(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Point the SDK at a loopback socket that accepts connections and never says a word."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        monkeypatch.setattr(tunnel_module, "_server_addr", address)
        yield address


def _ngrok_reachable() -> bool:
    try:
        with socket.create_connection(("connect.ngrok-agent.com", 443), timeout=2.0):
            return True
    except OSError:
        return False


# (a) no auth token ---------------------------------------------------------------------------

@pytest.mark.parametrize("env_value", [None, "", "  \n"])
def test_no_token_says_where_to_set_and_get_one(monkeypatch: pytest.MonkeyPatch,
                                                env_value: str | None) -> None:
    """With no token anywhere the SDK would only fail once it reached ngrok (with ERR_NGROK_4018),
    and offline it would report a network error instead; so the module checks first."""
    if env_value is not None:
        monkeypatch.setenv("NGROK_AUTHTOKEN", env_value)
    with pytest.raises(TunnelError) as info:
        open_tcp_tunnel(5555, timeout=SHORT_TIMEOUT_S)
    message = str(info.value)
    assert "No ngrok auth token" in message
    assert "NGROK_AUTHTOKEN" in message and "--ngrok-authtoken" in message
    assert "https://dashboard.ngrok.com/get-started/your-authtoken" in message
    assert ADVERTISE_HINT in message


def test_token_from_the_environment_is_used(monkeypatch: pytest.MonkeyPatch,
                                            refused_service: str) -> None:
    """NGROK_AUTHTOKEN gets past the token check and on to the (unreachable) service."""
    monkeypatch.setenv("NGROK_AUTHTOKEN", BOGUS_TOKEN)
    with pytest.raises(TunnelError) as info:
        open_tcp_tunnel(5555, timeout=SHORT_TIMEOUT_S)
    assert "Could not reach ngrok's service" in str(info.value)


def test_service_reporting_no_token() -> None:
    """ERR_NGROK_4018 needs ngrok's service to produce it; this passes the ValueError the SDK
    builds from that refusal (context, ngrok's message, code) to the translation directly."""
    exc = ValueError("failed to connect session",
                     "Usage of ngrok requires a verified account and authtoken.\n"
                     "Sign up for an account: https://dashboard.ngrok.com/signup",
                     "ERR_NGROK_4018")
    message = str(translate_sdk_error(exc))
    assert "ERR_NGROK_4018" in message
    assert "NGROK_AUTHTOKEN" in message and "--ngrok-authtoken" in message
    assert "https://dashboard.ngrok.com/get-started/your-authtoken" in message


# (b) an account that may not open TCP endpoints -------------------------------------------------

@pytest.mark.parametrize("code, ngrok_text", [
    ("ERR_NGROK_8013", "You must add a credit or debit card before you can use TCP endpoints on a "
                       "free account. We require a valid card as a way to combat abuse and keep the "
                       "internet a safe place. This card will NOT be charged.\nAdd a card to your "
                       "account here: https://dashboard.ngrok.com/settings#id-verification."),
    ("ERR_NGROK_302", "TCP tunnels are only available to registered users.\n"
                      "Sign up for free at: https://dashboard.ngrok.com/signup"),
])
def test_tcp_not_allowed(code: str, ngrok_text: str) -> None:
    """Only ngrok's service can refuse a TCP endpoint, so this is a stand-in for it: the exception
    is the one the SDK raises when the refusal arrives while starting the listener
    (``ValueError("failed to start listener", message, code)``), passed to the translation."""
    exc = ValueError("failed to start listener", ngrok_text, code)
    error = translate_sdk_error(exc, authtoken=BOGUS_TOKEN)
    message = str(error)
    assert isinstance(error, TunnelError)
    assert code in message
    assert "card" in message and "verified" in message
    assert "https://dashboard.ngrok.com/settings#id-verification" in message
    assert ADVERTISE_HINT in message
    assert "ssh -R" in message


# (c) an invalid or revoked token --------------------------------------------------------------

@pytest.mark.parametrize("code, ngrok_text, reason", [
    ("ERR_NGROK_105", "The authtoken you specified does not look like a proper ngrok authtoken.\n"
                      f"Your authtoken: {BOGUS_TOKEN}", "does not look like"),
    ("ERR_NGROK_106", "The authtoken you specified is an ngrok v1 authtoken, but you're using "
                      f"ngrok v2.\nYour authtoken: {BOGUS_TOKEN}", "v1"),
    ("ERR_NGROK_107", "The authtoken you specified is properly formed, but it is invalid.\n"
                      f"Your authtoken: {BOGUS_TOKEN}\nThis usually happens when:\n"
                      "- You reset your authtoken", "revoked"),
])
def test_rejected_token(code: str, ngrok_text: str, reason: str) -> None:
    """Only ngrok's service can reject a token, so this is a stand-in for it: the exception is the
    one the SDK raises when authentication fails (``ValueError("failed to connect session",
    message, code)``). ngrok echoes the token back; the message must not."""
    exc = ValueError("failed to connect session", ngrok_text, code)
    message = str(translate_sdk_error(exc, authtoken=BOGUS_TOKEN))
    assert "ngrok rejected the auth token" in message
    assert code in message and reason in message
    assert "https://dashboard.ngrok.com/get-started/your-authtoken" in message
    assert BOGUS_TOKEN not in message


def test_session_limit() -> None:
    """Stand-in for ngrok's service refusing a second agent session (ERR_NGROK_108), as the SDK
    raises it: the message names what to stop."""
    exc = ValueError("failed to connect session",
                     "Your account is limited to 1 simultaneous ngrok agent sessions.", "ERR_NGROK_108")
    message = str(translate_sdk_error(exc))
    assert "ERR_NGROK_108" in message and "remote-worker --ngrok" in message
    assert "https://dashboard.ngrok.com/agents" in message


def test_other_codes_pass_ngroks_text_through_without_the_token() -> None:
    """Stand-in for a refusal this module has no special message for: ngrok's own text, the code's
    page, and never the token."""
    exc = ValueError("failed to start listener",
                     f"Something about {BOGUS_TOKEN} went wrong.", "ERR_NGROK_102")
    message = str(translate_sdk_error(exc, authtoken=BOGUS_TOKEN))
    assert "ERR_NGROK_102" in message
    assert "https://ngrok.com/docs/errors/err_ngrok_102" in message
    assert "went wrong" in message and BOGUS_TOKEN not in message


# (d) no network, or a service that does not answer --------------------------------------------

def test_bogus_token_against_the_real_service() -> None:
    """The default service address, with a token ngrok would reject. From the test machines
    (no network) the SDK fails to connect at once; where ngrok is reachable, it rejects the token."""
    started = time.monotonic()
    with pytest.raises(TunnelError) as info:
        open_tcp_tunnel(5555, authtoken=BOGUS_TOKEN, timeout=SHORT_TIMEOUT_S)
    message = str(info.value)
    assert time.monotonic() - started < SHORT_TIMEOUT_S + 3.0
    assert BOGUS_TOKEN not in message
    if _ngrok_reachable():
        assert "ngrok rejected the auth token" in message
    else:
        assert isinstance(info.value.__cause__, (ValueError, asyncio.TimeoutError))
        assert ("Could not reach ngrok's service" in message
                or "did not answer within" in message)
        assert "internet connection" in message and ADVERTISE_HINT in message


@pytest.mark.parametrize("open_tunnel", [open_tcp_tunnel, open_https_tunnel])
def test_unreachable_service(refused_service: str, open_tunnel: Callable[..., object]) -> None:
    """A closed port: the SDK raises ValueError('failed to connect session', 'failed to establish
    tcp connection') at once, and the message says to check the network; for the hub's TCP tunnel
    and the --browser page's HTTPS one alike."""
    with pytest.raises(TunnelError) as info:
        open_tunnel(5555, authtoken=BOGUS_TOKEN, timeout=SHORT_TIMEOUT_S)
    cause = info.value.__cause__
    assert isinstance(cause, ValueError) and cause.args[0] == "failed to connect session"
    message = str(info.value)
    assert "Could not reach ngrok's service (failed to establish tcp connection)" in message
    assert "internet connection" in message and ADVERTISE_HINT in message


def test_service_that_never_answers_times_out(silent_service: str) -> None:
    """The SDK connects and waits for a TLS handshake that never comes; the timeout ends it."""
    started = time.monotonic()
    with pytest.raises(TunnelError) as info:
        open_tcp_tunnel(5555, authtoken=BOGUS_TOKEN, timeout=SHORT_TIMEOUT_S)
    elapsed = time.monotonic() - started
    assert SHORT_TIMEOUT_S - 0.1 <= elapsed < SHORT_TIMEOUT_S + 3.0
    message = str(info.value)
    assert f"did not answer within {SHORT_TIMEOUT_S:g} s" in message
    assert "internet connection" in message and ADVERTISE_HINT in message


def test_exiting_right_after_a_timeout_does_not_abort(silent_service: str) -> None:
    """A CLI prints the error and exits at once. Without a pause after cancelling, the SDK's
    runtime takes the GIL during interpreter shutdown and the process aborts (exit 134)."""
    script = (
        "import sys\n"
        "import remote_magic.hub.tunnel as t\n"
        f"t._server_addr = {silent_service!r}\n"
        "try:\n"
        f"    t.open_tcp_tunnel(5555, authtoken={BOGUS_TOKEN!r}, timeout=0.5)\n"
        "except t.TunnelError:\n"
        "    sys.exit(3)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 3, result.stderr
    assert "FATAL" not in result.stderr and "panicked" not in result.stderr


def test_works_from_inside_a_running_event_loop(refused_service: str) -> None:
    """A Jupyter kernel's thread runs an event loop; the SDK's awaitables need their own."""

    async def call() -> None:
        open_tcp_tunnel(5555, authtoken=BOGUS_TOKEN, timeout=SHORT_TIMEOUT_S)

    with pytest.raises(TunnelError, match="Could not reach ngrok's service"):
        asyncio.run(call())


# (e) the ngrok package missing -----------------------------------------------------------------

def test_missing_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand-in for a platform without an ngrok wheel: ``sys.modules['ngrok'] = None`` makes
    ``import ngrok`` raise ImportError, as it does where the package is not installed."""
    monkeypatch.setitem(sys.modules, "ngrok", None)
    with pytest.raises(TunnelError) as info:
        open_tcp_tunnel(5555, authtoken=BOGUS_TOKEN, timeout=SHORT_TIMEOUT_S)
    assert isinstance(info.value.__cause__, ImportError)
    message = str(info.value)
    assert "ngrok package is not installed" in message
    assert "pip install ngrok" in message and ADVERTISE_HINT in message


# arguments, and a tunnel that really opens ------------------------------------------------------

@pytest.mark.parametrize("port", [0, 65536, -1, "5555", True])
def test_bad_port_is_a_value_error(port: object) -> None:
    with pytest.raises(ValueError, match="local_port"):
        open_tcp_tunnel(port, authtoken=BOGUS_TOKEN)  # type: ignore[arg-type]


def test_bad_timeout_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="timeout"):
        open_tcp_tunnel(5555, authtoken=BOGUS_TOKEN, timeout=0)


def test_no_error_message_or_log_line_holds_the_token(caplog: pytest.LogCaptureFixture,
                                                      silent_service: str) -> None:
    caplog.set_level("DEBUG")
    with pytest.raises(TunnelError) as info:
        open_tcp_tunnel(5555, authtoken=BOGUS_TOKEN, timeout=0.5)
    assert BOGUS_TOKEN not in str(info.value)
    assert caplog.records and BOGUS_TOKEN not in caplog.text


@pytest.mark.skipif(not REAL_TOKEN,
                    reason="needs ngrok's service: set REMOTE_MAGIC_TEST_NGROK=1 and NGROK_AUTHTOKEN "
                           "(an account allowed TCP endpoints)")
def test_real_tunnel_round_trip() -> None:
    """Open a tunnel to a local echo server, talk through the public address, close twice."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(30)

        def echo_once() -> None:
            conn, _ = server.accept()
            with conn:
                conn.sendall(conn.recv(64))

        threading.Thread(target=echo_once, daemon=True).start()
        with open_tcp_tunnel(server.getsockname()[1], authtoken=REAL_TOKEN) as tunnel:
            match = re.match(r"^tcp://([^:/]+):(\d+)$", tunnel.public_address)
            assert match, tunnel.public_address
            with socket.create_connection((match.group(1), int(match.group(2))), timeout=30) as c:
                c.sendall(b"ping")
                c.settimeout(30)
                assert c.recv(64) == b"ping"
        assert tunnel.closed
        tunnel.close()  # idempotent


@pytest.mark.skipif(not REAL_TOKEN,
                    reason="needs ngrok's service: set REMOTE_MAGIC_TEST_NGROK=1 and NGROK_AUTHTOKEN "
                           "(an account allowed TCP endpoints)")
def test_real_https_endpoint_beside_the_hubs_tunnel() -> None:
    """`remote-worker --ngrok --browser`: the page's HTTPS endpoint on the hub tunnel's one session (a free
    account has one at a time); closing it leaves the hub's open."""
    import urllib.request
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    page = ThreadingHTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)
    threading.Thread(target=page.serve_forever, daemon=True).start()
    try:
        with open_tcp_tunnel(5555, authtoken=REAL_TOKEN) as hub_tunnel:
            https = hub_tunnel.https_endpoint(page.server_port)
            assert https.public_address.startswith("https://")
            with urllib.request.urlopen(https.public_address, timeout=30) as answer:
                assert answer.status == 200
            https.close()
            assert not hub_tunnel.closed
    finally:
        page.shutdown()
