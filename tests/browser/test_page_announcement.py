"""What `remote-worker --browser` prints about its page (worker/browser/announce.py): a QR code only for a
link another device can open as a GPU worker, and for the rest what a phone needs instead. The loopback case
is also read from a real remote-worker's output in test_browser.py."""

from __future__ import annotations

import pytest

from remote_magic.worker.browser.announce import PageAddress, announcement

QR_BLOCKS = ("█", "▀", "▄")


def has_qr_code(text: str) -> bool:
    return any(block in text for block in QR_BLOCKS)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_a_link_only_this_machine_can_open_gets_no_qr_code_but_what_a_phone_needs(host: str) -> None:
    said = announcement(PageAddress(host, f"http://{host}:5588/#secret", tls=False, tunnel=False))
    assert "http://" in said and "/#secret" in said
    assert not has_qr_code(said), said
    assert f"this link opens only in a browser on this machine ({host})" in said
    assert "--ngrok" in said and "--browser-cert" in said and "--browser-key" in said


def test_a_lan_link_over_plain_http_gets_no_qr_code_since_other_devices_get_no_webgpu_there() -> None:
    said = announcement(PageAddress("0.0.0.0", "http://mybox:5588/#secret", tls=False, tunnel=False))
    assert not has_qr_code(said), said
    assert "gives it no WebGPU (that needs HTTPS)" in said and "--ngrok" in said and "--browser-cert" in said


@pytest.mark.parametrize("page", [
    PageAddress("127.0.0.1", "https://abc.ngrok.app/#secret", tls=False, tunnel=True),
    PageAddress("0.0.0.0", "https://mybox:5588/#secret", tls=True, tunnel=False),
], ids=["tunnel", "lan-https"])
def test_a_link_other_devices_can_open_as_a_worker_comes_with_its_qr_code(page: PageAddress) -> None:
    said = announcement(page)
    assert page.link in said and "point a phone's camera at this code" in said
    assert has_qr_code(said.split(page.link)[1]), said
    assert "opens only" not in said and "no WebGPU" not in said
