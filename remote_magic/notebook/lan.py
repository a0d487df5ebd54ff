"""`%offload_connect --lan`: list the hubs found on the LAN, and connect to the one a token opens."""

from __future__ import annotations

from ..errors import DiscoveryError
from ..lan import discover
from ..wire.discovery import DEFAULT_BROWSE_S, DiscoveredHub, token_fingerprint
from ..wire.tokens import Token


def hubs_table(hubs: list[DiscoveredHub]) -> str:
    """One line per hub: name, host, address:port, key fingerprint."""
    rows = [("name", "host", "address", "fingerprint")]
    rows += [(h.name, h.host, ", ".join(f"{a}:{h.port}" for a in h.addresses), h.fingerprint[:16]) for h in hubs]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[3] for row in rows)


def find_lan_hub(token: str | None, browse_s: float | None) -> tuple[Token, DiscoveredHub] | None:
    """Browse for ``browse_s`` seconds (default 3) and print what answered; with a token, its hub (to connect to).

    Without a token this only lists (and says how to connect), returning None: discovery never replaces
    the token. Raises DiscoveryError when no hub found is the token's, TokenError for a malformed token.
    """
    wanted = Token.decode(token) if token else None
    browse_s = browse_s or DEFAULT_BROWSE_S
    hubs = discover(browse_s, token=wanted)
    if wanted is None:
        if not hubs:
            print(f"No remote-magic hub answered on this network within {browse_s:g} s. On the worker machine "
                  "run `remote-worker --lan` (it listens on 0.0.0.0:5587 by default).")
            return None
        print(f"Hubs on this network:\n{hubs_table(hubs)}\n\nTo connect, give the token that hub's remote-worker "
              "printed: %offload_connect --lan TOKEN (or set REMOTE_MAGIC_TOKEN). Discovery finds the address; "
              "the token is still what lets you in.")
        return None
    matching = [hub for hub in hubs if hub.matches(wanted)]
    if not matching:
        fingerprint = token_fingerprint(wanted)[:16]
        seen = f"Hubs that answered:\n{hubs_table(hubs)}" if hubs else "No hub answered at all."
        raise DiscoveryError(
            f"no hub on this network within {browse_s:g} s is the one this token opens (key fingerprint "
            f"{fingerprint}). {seen}\nIs its remote-worker running with --lan, on this network? Without --lan, "
            f"%offload_connect TOKEN dials the address in the token ({wanted.address}).")
    hub = matching[0]
    print(f"Found {hub.name!r} on {hub.host or '?'} at {hub.address} (key fingerprint {hub.fingerprint[:16]})")
    return wanted, hub
