"""Tokens: one copy-pasteable string that holds a hub's address and the credentials to reach it.

A token is ``rmc1.`` (a client: submits jobs) or ``rmw1.`` (a worker: joins the fleet)
followed by URL-safe base64 of::

    hub public key (32 bytes) | peer public key (32) | peer secret key (32) | address (UTF-8)

The hub accepts a CurveZMQ handshake only from the two peer public keys it issued, and the
key a peer authenticated with fixes its role. Tokens are secrets: log ``Token.redacted()``.
"""

from __future__ import annotations

import base64
import binascii
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from zmq.utils import z85

from ..errors import TokenError
from .protocol import Role

_PREFIXES = {Role.CLIENT: "rmc1.", Role.WORKER: "rmw1."}
_KEY_BYTES = 32


@dataclass(frozen=True)
class Token:
    """A hub address plus one peer's CurveZMQ key pair and the hub's public key (all Z85)."""

    role: Role
    address: str
    server_public: bytes
    public: bytes
    secret: bytes

    def encode(self) -> str:
        """The copy-pasteable text form."""
        raw = b"".join(z85.decode(k) for k in (self.server_public, self.public, self.secret))
        raw += self.address.encode()
        return _PREFIXES[self.role] + base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> "Token":
        """Parse a token, saying what is wrong with it when it can't be used."""
        text = (text or "").strip().strip("'\"")
        if text.startswith("%offload_connect"):
            text = text.split(None, 1)[-1].strip()
        role = next((r for r, p in _PREFIXES.items() if text.startswith(p)), None)
        if role is None:
            raise TokenError(
                "that is not a remote-magic token (it should start with 'rmc1.' for a notebook or "
                "'rmw1.' for a worker); copy the whole line `remote-worker` printed"
            )
        body = text[len(_PREFIXES[role]):]
        try:
            raw = base64.b64decode(body + "=" * (-len(body) % 4), altchars=b"-_", validate=True)
        except (binascii.Error, ValueError):
            raise TokenError("the token is damaged (not valid base64): copy it again in one piece") from None
        if len(raw) <= 3 * _KEY_BYTES:
            raise TokenError("the token is truncated: copy it again in one piece")
        keys = [z85.encode(raw[i * _KEY_BYTES:(i + 1) * _KEY_BYTES]) for i in range(3)]
        try:
            address = raw[3 * _KEY_BYTES:].decode()
        except UnicodeDecodeError:
            raise TokenError("the token is damaged (bad address): copy it again in one piece") from None
        if not address.startswith("tcp://") or address.count(":") < 2:
            raise TokenError(f"the token's address {address!r} is not tcp://HOST:PORT: copy it again")
        return cls(role, address, *keys)

    def with_address(self, address: str) -> "Token":
        """The same credentials for another address (a tunnel, a forwarded port)."""
        return Token(self.role, address, self.server_public, self.public, self.secret)

    def redacted(self) -> str:
        """A form safe for logs: the kind, the address and a short fingerprint."""
        return f"{_PREFIXES[self.role]}…{self.public[:6].decode()} ({self.role.value} for {self.address})"


def write_private(path: Path, text: str) -> None:
    """Write text atomically with owner-only permissions (the file never exists half-written)."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mkstemp makes it 0600
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
