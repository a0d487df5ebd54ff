"""LAN discovery: `remote-worker --lan` advertises its hub by mDNS/DNS-SD; `%offload_connect --lan TOKEN` finds
the hub that token opens and connects to it where it is now. Discovery never replaces the token.

Multicast is sent only inside two network namespaces each test creates and removes, joined by a veth
pair: never on this machine's real interfaces. Both ends bind zeroconf to their veth address.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from netns import Link, linked_namespaces

import remote_magic
from remote_magic.wire.discovery import (
    DiscoveredHub,
    fingerprint,
    hub_from_record,
    token_fingerprint,
    txt_record,
)
from remote_magic.wire.install import install_command
from remote_magic.wire.keys import HubKeys
from remote_magic.wire.protocol import Role
from support import start_worker

BLOCK_ZEROCONF = "import sys\nsys.modules['zeroconf'] = None  # as if it were not installed\n"


@pytest.fixture
def lan() -> Iterator[Link]:
    with linked_namespaces("LAN discovery tests", multicast=True) as link:
        yield link


NOTEBOOK = r'''
import json, sys, threading
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from zeroconf import ServiceBrowser, ServiceStateChange, Zeroconf
import remote_magic
from remote_magic.wire.discovery import SERVICE_TYPE
from remote_magic.wire.keys import HubKeys
from remote_magic.wire.protocol import Role
from remote_magic.wire.tokens import Token

token, interface = sys.argv[1], sys.argv[2]
report = {}
hubs = remote_magic.discover(60, token=token, interfaces=[interface])
report["discovered"] = [dict(name=h.name, addresses=list(h.addresses), port=h.port, fingerprint=h.fingerprint,
                             matches=h.matches(token)) for h in hubs]
shell = InteractiveShell.instance()

def cell(code):
    with capture_output() as out:
        result = shell.run_cell(code)
    return {"ok": result.success, "output": out.stdout + out.stderr}

cell("%load_ext remote_magic")
# The token's address is out of date (the hub's LAN address changed): discovery supplies the current one.
stale = Token.decode(token).with_address("tcp://192.0.2.1:5587").encode()
report["connect"] = cell(f"%offload_connect --lan --timeout 60 {stale}")
report["run"] = cell("%%offload\nanswer = 6 * 7\n")
report["answer"] = shell.user_ns.get("answer")
# Listing, and looking for another token's hub, leave this notebook's connection as it was.
report["list"] = cell("%offload_connect --lan --timeout 3")
other = HubKeys.generate().token(Role.CLIENT, "tcp://10.0.0.9:5587").encode()
report["other"] = cell(f"%offload_connect --lan --timeout 3 {other}")
report["still"] = cell("%%offload\nanswer = answer + 1\n")
report["answer_after"] = shell.user_ns.get("answer")
cell("%offload_disconnect")

# Keep browsing while the test stops the worker: its goodbye makes the hub disappear at once.
seen = {state: threading.Event() for state in ServiceStateChange}
zc = Zeroconf(interfaces=[interface])
browser = ServiceBrowser(zc, SERVICE_TYPE, handlers=[lambda **event: seen[event["state_change"]].set()])
report["added"] = seen[ServiceStateChange.Added].wait(60)
print(json.dumps(report), flush=True)
sys.stdin.readline()  # the test has stopped the worker
removed = seen[ServiceStateChange.Removed].wait(20)
browser.cancel()
zc.close()
print(json.dumps({"removed": removed}), flush=True)
'''


def test_a_notebook_finds_the_hub_its_token_opens_and_runs_a_cell_there(lan: Link, tmp_path: Path) -> None:
    worker = start_worker(tmp_path, "--lan", "--listen", f"{lan.a_ip}:0", "--gpu", "off", "--name", "lanhub",
                          "-v", wrapper=("ip", "netns", "exec", lan.a))
    notebook: subprocess.Popen[str] | None = None
    try:
        token = worker.token
        hub_fingerprint = token_fingerprint(token)
        log = worker.log()
        assert f"mDNS on {lan.a_ip} only" in log  # zeroconf is bound to the veth address and nothing else
        assert f"key fingerprint {hub_fingerprint[:16]}" in log
        # A hub on 0.0.0.0 would advertise on each non-loopback IPv4 address: in this namespace, the veth's.
        wildcard = subprocess.run(["ip", "netns", "exec", lan.a, sys.executable, "-c", "from remote_magic.hub."
                                   "advertise import lan_interfaces; print(lan_interfaces('0.0.0.0'))"],
                                  capture_output=True, text=True, timeout=60)
        assert wildcard.stdout.strip() == repr([lan.a_ip]), wildcard.stderr
        script = tmp_path / "notebook.py"
        script.write_text(NOTEBOOK)
        environment = {k: v for k, v in os.environ.items() if k != "REMOTE_MAGIC_TOKEN"}
        notebook = subprocess.Popen(["ip", "netns", "exec", lan.b, sys.executable, str(script), token,
                                     lan.b_ip], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=environment)
        assert notebook.stdout is not None and notebook.stdin is not None
        first = notebook.stdout.readline()
        assert first, f"the notebook script failed:\n{notebook.communicate(timeout=30)[1]}"
        report = json.loads(first)
        [found] = [hub for hub in report["discovered"] if hub["matches"]]
        assert report["added"]
        assert found["name"] == "lanhub" and found["addresses"] == [lan.a_ip]
        assert found["fingerprint"] == hub_fingerprint
        assert f"tcp://{lan.a_ip}:{found['port']}" == remote_magic.wire.tokens.Token.decode(token).address

        assert report["list"]["ok"], report["list"]
        assert "lanhub" in report["list"]["output"] and f"{lan.a_ip}:{found['port']}" in report["list"]["output"]
        assert hub_fingerprint[:16] in report["list"]["output"]
        assert "%offload_connect --lan TOKEN" in report["list"]["output"]
        assert not report["other"]["ok"]
        assert "is the one this token opens" in report["other"]["output"] and "lanhub" in report["other"]["output"]

        assert report["connect"]["ok"], report["connect"]
        assert f"Connected to tcp://{lan.a_ip}:{found['port']}" in report["connect"]["output"]
        assert report["run"]["ok"], report["run"]
        assert report["answer"] == 42
        assert report["still"]["ok"] and report["answer_after"] == 43, report["still"]

        worker.stop()
        assert worker.process.returncode == 0, worker.log()
        notebook.stdin.write("stopped\n")
        notebook.stdin.flush()
        out, err = notebook.communicate(timeout=60)
        assert notebook.returncode == 0, err
        assert json.loads(out)["removed"], "the worker did not withdraw its advertisement on shutdown"
    finally:
        worker.stop()
        if notebook is not None and notebook.poll() is None:
            notebook.kill()
            notebook.wait()


def _remote_worker(tmp: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["remote-worker", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "REMOTE_MAGIC_HOME": str(tmp), **(env or {})})


def test_lan_on_a_loopback_only_hub_is_refused_saying_what_to_listen_on(tmp_path: Path) -> None:
    result = _remote_worker(tmp_path, "--lan", "--listen", "127.0.0.1:0", "--gpu", "off")
    assert result.returncode == 2
    assert "listens on 127.0.0.1 only" in result.stderr and "--listen 0.0.0.0:5587" in result.stderr
    result = _remote_worker(tmp_path, "--lan", "--join", "--gpu", "off", env={"REMOTE_MAGIC_JOIN_TOKEN": "rmw1.x"})
    assert result.returncode == 2 and "--lan advertises the hub this command starts" in result.stderr


def test_without_zeroconf_each_side_names_the_install(tmp_path: Path) -> None:
    hooks = tmp_path / "hooks"  # on sys.path first: its sitecustomize.py runs as Python starts
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(BLOCK_ZEROCONF)
    env = {"PYTHONPATH": str(hooks)}
    worker = _remote_worker(tmp_path, "--lan", "--listen", "0.0.0.0:0", "--gpu", "off", env=env)
    assert worker.returncode == 2
    # This copy's own install, with the extra (the package isn't on the index: remote-magic[lan] alone fails).
    assert "lacks zeroconf" in worker.stderr and install_command("worker") in worker.stderr
    notebook = subprocess.run(
        [sys.executable, "-c", "import remote_magic\ntry:\n    remote_magic.discover(0.1)\n"
         "except remote_magic.DiscoveryError as exc:\n    print(exc)\n"
         "from IPython.core.interactiveshell import InteractiveShell\nshell = InteractiveShell.instance()\n"
         "shell.run_cell('%load_ext remote_magic')\nshell.run_cell('%offload_connect --lan')\n"],
        capture_output=True, text=True, timeout=120, env={**os.environ, **env})
    assert notebook.returncode == 0, notebook.stderr
    output = notebook.stdout + notebook.stderr
    assert output.count(install_command("lan")) == 2, output
    assert "Traceback" not in output


def test_an_advertisement_carries_public_facts_only_and_names_the_tokens_hub() -> None:
    keys = HubKeys.generate()
    record = txt_record("box", "box.example", "RM1", "1.0", fingerprint(keys.server_public), 5587)
    secrets_in_keys = [keys.server_secret, *(k for pair in keys.peers.values() for k in pair)]
    assert not any(secret.decode() in value for secret in secrets_in_keys for value in record.values())
    assert keys.server_public.decode() not in record.values()
    properties = {k.encode(): v.encode() for k, v in record.items()}
    hub = hub_from_record("box._remote-magic._tcp.local.", ["10.1.2.3", "fe80::1"], 5587, properties)
    assert hub is not None and hub.addresses == ("10.1.2.3",) and hub.address == "tcp://10.1.2.3:5587"
    client_token = keys.token(Role.CLIENT, "tcp://192.0.2.1:1")
    assert hub.matches(client_token) and hub.matches(client_token.encode())
    assert hub.token_for(client_token).address == "tcp://10.1.2.3:5587"
    assert hub.token_for(client_token).secret == client_token.secret
    stranger = HubKeys.generate().token(Role.CLIENT, "tcp://10.1.2.3:5587")
    with pytest.raises(remote_magic.TokenError, match="this token is for another hub"):
        hub.token_for(stranger)


@pytest.mark.parametrize("change", [
    {b"fp": b"not-hex"}, {b"fp": None}, {b"port": b"1"}, {b"name": b"\xff\xfe"}, {b"fp": b"ab" * 40},
])
def test_a_malformed_advertisement_is_ignored(change: dict[bytes, bytes | None]) -> None:
    record = txt_record("box", "box", "RM1", "1.0", fingerprint(HubKeys.generate().server_public), 5587)
    properties: dict[bytes, bytes | None] = {k.encode(): v.encode() for k, v in record.items()}
    assert isinstance(hub_from_record("s", ["10.1.2.3"], 5587, properties), DiscoveredHub)
    assert hub_from_record("s", ["10.1.2.3"], 5587, {**properties, **change}) is None
    assert hub_from_record("s", ["fe80::1"], 5587, properties) is None
    assert hub_from_record("s", ["10.1.2.3"], 0, properties) is None
