"""What ``remote-worker --browser`` prints about its page: the link, who can open it, and a QR code only
where a phone's camera can use it.

A browser offers WebGPU only to a secure context: ``http://127.0.0.1`` on the same machine, or HTTPS (an
ngrok tunnel, or the user's certificate). So a QR code goes with a link another device can open as a
worker: through a tunnel, or over HTTPS on an address other than this machine's own. A link on a
loopback address opens only here, and one over plain HTTP on the LAN opens elsewhere as a page that
can't use the GPU: for those the announcement says what a phone needs instead.
"""

from __future__ import annotations

import io
import ipaddress
from dataclasses import dataclass

PHONE_NEEDS = ("for a phone or another device, start remote-worker with --ngrok (an HTTPS link that opens "
               "anywhere), or with --browser 0.0.0.0:5588 --browser-cert cert.pem --browser-key key.pem (a LAN "
               "address over HTTPS, with a certificate the device trusts, e.g. made by mkcert)")


@dataclass(frozen=True)
class PageAddress:
    """Where the page is served: ``host`` it listens on, ``link`` to open, whether over HTTPS (``tls``) and
    through a tunnel (``tunnel``)."""

    host: str
    link: str
    tls: bool
    tunnel: bool

    @property
    def this_machine_only(self) -> bool:
        """True when only a browser on this machine can open the link (a loopback address, no tunnel)."""
        if self.tunnel:
            return False
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host.strip("[]")).is_loopback
        except ValueError:  # a host name: whoever resolves it
            return False

    @property
    def other_devices_get_webgpu(self) -> bool:
        """True when another device can open the link as a secure context, so its tab can use WebGPU."""
        return self.tunnel or (self.tls and not self.this_machine_only)


def announcement(page: PageAddress) -> str:
    """The lines to print for ``page``: its link, who can open it, and its QR code when another device can
    use it."""
    lines = ["remote-worker: to make a browser tab a GPU worker, open this link in it (it holds a secret: share it "
             f"only with devices you trust):\n\n    {page.link}\n"]
    if page.this_machine_only:
        lines.append(f"remote-worker: this link opens only in a browser on this machine ({page.host}); {PHONE_NEEDS}")
    elif not page.other_devices_get_webgpu:
        lines.append("remote-worker: over plain HTTP another device opens this page, but its browser gives it no "
                     f"WebGPU (that needs HTTPS), so no QR code: {PHONE_NEEDS}")
    else:
        lines.append("remote-worker: or point a phone's camera at this code:\n")
        lines.append(qr_code(page.link))
    return "\n".join(lines) + "\n"


def qr_code(text: str) -> str:
    """``text`` as a QR code drawn with block characters, for a terminal."""
    import segno  # the [worker] extra's, checked for before --browser starts

    out = io.StringIO()
    segno.make(text, error="l").terminal(out=out, compact=True)
    return out.getvalue()
