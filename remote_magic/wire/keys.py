"""The hub's CurveZMQ keys: generated once, kept in the user's config directory.

Three key pairs: the hub's own (server) pair, the pair every client token carries and the pair
every worker token carries. ``rotate`` replaces the two peer pairs, so every old token stops
working; the hub keeps its own pair, so a running hub needs no new socket.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import zmq

from .protocol import Role
from .tokens import Token, write_private


def config_dir() -> Path:
    """Where keys live: $REMOTE_MAGIC_HOME, else $XDG_CONFIG_HOME/remote-magic, else ~/.config/remote-magic."""
    if os.environ.get("REMOTE_MAGIC_HOME"):
        return Path(os.environ["REMOTE_MAGIC_HOME"]).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "remote-magic"


@dataclass(frozen=True)
class HubKeys:
    """The hub's key pair and the public keys of the peers it lets in, by role (all Z85)."""

    server_public: bytes
    server_secret: bytes
    peers: dict[Role, tuple[bytes, bytes]]

    @classmethod
    def generate(cls) -> "HubKeys":
        """Fresh keys, e.g. for a hub that lives only as long as its notebook."""
        return cls(*zmq.curve_keypair(), {role: zmq.curve_keypair() for role in Role})

    def role_of(self, public: bytes) -> Role | None:
        """The role a peer's public key grants, or None for a stranger."""
        return next((role for role, (pub, _) in self.peers.items() if pub == public), None)

    def token(self, role: Role, address: str) -> Token:
        """The token a peer of ``role`` pastes to reach the hub at ``address``."""
        public, secret = self.peers[role]
        return Token(role, address, self.server_public, public, secret)

    def to_json(self) -> str:
        return json.dumps({
            "server": [self.server_public.decode(), self.server_secret.decode()],
            **{role.value: [k.decode() for k in pair] for role, pair in self.peers.items()},
        })

    @classmethod
    def from_json(cls, text: str) -> "HubKeys":
        data = json.loads(text)
        server = [k.encode() for k in data["server"]]
        peers = {role: tuple(k.encode() for k in data[role.value]) for role in Role}
        return cls(server[0], server[1], peers)


def key_file(directory: Path | None = None) -> Path:
    return (directory or config_dir()) / "hub-keys.json"


def load_or_create(directory: Path | None = None) -> HubKeys:
    """The hub keys stored for this user, created (owner-only) on first use."""
    path = key_file(directory)
    if path.exists():
        return HubKeys.from_json(path.read_text())
    return rotate(directory)


def rotate(directory: Path | None = None) -> HubKeys:
    """Replace the stored peer keys; tokens made from the old ones stop working."""
    keys = HubKeys.generate()
    path = key_file(directory)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # owner-only, like the files in it
    if path.exists():
        old = HubKeys.from_json(path.read_text())
        keys = HubKeys(old.server_public, old.server_secret, keys.peers)
    write_private(path, keys.to_json())
    return keys
