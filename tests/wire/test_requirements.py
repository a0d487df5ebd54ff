"""Requirements (--require, --prefer) and the hub's placement, without sockets: the parser both sides
use, and the fleet's choice among workers with given capabilities and batteries (a browser tab's as its
worker reports them)."""

from __future__ import annotations

from typing import Any

import pytest

from remote_magic import RequirementError
from remote_magic.hub.fleet import Fleet
from remote_magic.hub.placement import unmatched
from remote_magic.hub.records import JobRecord, Peer
from remote_magic.wire.link import Link
from remote_magic.wire.protocol import Role
from remote_magic.wire.requirements import describe, parse, parse_quantity, placement_header, traits
from remote_magic.worker.capabilities import where_python_runs

CAPS = {"memory_bytes": 16 * 2**30, "cpu_count": 8, "python": "3.11.7", "system": "Linux", "speed": 40.0,
        "gpu": {"active": False}, "labels": {"vram": "24GB", "zone": "lab", "fast": "true"}}


@pytest.mark.parametrize("text, matches", [
    ("memory>=16GB", True), ("memory>=16GiB", True), ("memory>=17GiB", False), ("memory>=1TB", False),
    ("cpus>=8", True), ("cpus>8", False), ("python>=3.11", True), ("python<3.11", False), ("python==3.11", True),
    ("system==linux", True), ("system!=Linux", False), ("vram>=16GB", True), ("zone==LAB", True), ("fast", True),
    ("gpu", False), ("nope", False), ("nope==1", False),
])
def test_a_requirement_matches_what_a_worker_has(text: str, matches: bool) -> None:
    assert parse(text).matches(traits(CAPS)) is matches


@pytest.mark.parametrize("text, says", [
    ("memory>>1", "comes one value"), ("memory>=lots", "has no order"), ("1x", "not a trait name"),
    ("memory>=", "comes one value"), ("", "not a trait name"),
])
def test_a_malformed_requirement_is_an_error_that_says_what_to_write(text: str, says: str) -> None:
    with pytest.raises(RequirementError, match=says):
        parse(text)


def test_sizes_and_the_header() -> None:
    assert parse_quantity("16GB") == 16e9 and parse_quantity("512MiB") == 512 * 2**20 and parse_quantity("2G") == 2e9
    assert parse_quantity("3.11.2") is None and parse_quantity("lots") is None
    assert placement_header(["gpu", " memory >= 16GB "], "fastest") == {"require": ["gpu", "memory>=16GB"],
                                                                        "prefer": "fastest"}
    assert placement_header(None, None) == {}
    with pytest.raises(RequirementError, match="--prefer 'cheapest' is not known"):
        placement_header(None, "cheapest")


def _worker(fleet: Fleet, name: str, battery: tuple[int, bool] | None = None, **caps: Any) -> Peer:
    return _joined(fleet, name, {"cpu_count": 2, "memory_bytes": 2**33, **caps}, battery)


def _tab(fleet: Fleet, name: str, adapter_type: str) -> Peer:
    """A browser tab's worker, with the capabilities it reports: where its Python runs, and the tab's GPU."""
    gpu = {"active": True, "adapter": f"{name}'s adapter", "adapter_type": adapter_type, "backend": "WebGPU",
           "browser_tab": name, "limits": {"max_buffer_size": 2**28}}
    return _joined(fleet, name, {**where_python_runs(), "gpu": gpu, "labels": {"browser": "tab"}})


def _joined(fleet: Fleet, name: str, caps: dict[str, Any], battery: tuple[int, bool] | None = None) -> Peer:
    peer = Peer(name.encode(), Role.WORKER, name, {}, caps, link=Link(lambda frames: False))  # placement never sends
    if battery is not None:
        peer.stats = {"battery": {"percent": battery[0], "plugged_in": battery[1]}}
    fleet.join(peer)
    return peer


def _place(fleet: Fleet, *require: str, prefer: str | None = None) -> str | None:
    job = JobRecord(f"j{len(fleet.jobs)}", b"client", None, [], require=[parse(r) for r in require], prefer=prefer)
    fleet.enqueue(job)
    assigned = fleet.next_assignments()
    return assigned[0][1].name if assigned else None


def test_jobs_go_to_plugged_in_workers_first_and_to_one_on_battery_when_those_are_busy() -> None:
    fleet = Fleet()
    _worker(fleet, "laptop", battery=(80, False))
    _worker(fleet, "desk", battery=(100, True))
    assert _place(fleet) == "desk"
    assert _place(fleet) == "laptop"  # desk is busy: the one on battery is the last resort
    assert _place(fleet) is None


def test_battery_policies_and_the_floor_hold_workers_back_and_say_why() -> None:
    fleet = Fleet()
    _worker(fleet, "never", battery=(90, False), on_battery="never")
    _worker(fleet, "low", battery=(10, False), min_battery=30)
    job = JobRecord("held", b"client", None, [])
    fleet.enqueue(job)
    assert fleet.next_assignments() == []
    from remote_magic.hub.placement import held_by_power
    why = held_by_power(job, fleet.workers())
    assert why is not None and "(--on-battery never)" in why and "at 10%, under its --min-battery 30" in why
    _worker(fleet, "always", battery=(50, False), on_battery="always")
    assert [w.name for _, w in fleet.next_assignments()] == ["always"]


def test_prefer_fastest_picks_a_gpu_then_the_highest_speed() -> None:
    fleet = Fleet()
    _worker(fleet, "slow", speed=10.0)
    _worker(fleet, "quick", speed=50.0)
    assert _place(fleet, prefer="fastest") == "quick"
    fleet = Fleet()
    _worker(fleet, "slow", speed=10.0)
    _worker(fleet, "quick", speed=50.0)
    _worker(fleet, "gpu", speed=5.0, gpu={"active": True, "adapter": "A100"})
    assert _place(fleet, prefer="fastest") == "gpu"
    assert _place(fleet) == "slow"  # without a preference: the first to have joined


def test_requirements_pick_the_worker_that_has_it_and_wait_only_for_workers_that_could() -> None:
    fleet = Fleet()
    _worker(fleet, "small")
    big = _worker(fleet, "big", labels={"vram": "24GB"})
    assert _place(fleet, "vram>=16GB") == "big"
    assert _place(fleet, "vram>=16GB") is None  # big is busy: it waits for big
    assert big.job is not None
    assert not fleet.could_run(JobRecord("x", b"client", None, [], require=[parse("memory>=1TB")]))


def test_a_software_adapter_takes_a_gpu_job_only_when_no_hardware_gpu_that_fits_is_idle() -> None:
    fleet = Fleet()
    _worker(fleet, "lavapipe", speed=40.0, gpu={"active": True, "adapter": "llvmpipe", "adapter_type": "software"})
    _tab(fleet, "phone", "software")
    _worker(fleet, "a100", speed=5.0, gpu={"active": True, "adapter": "A100", "adapter_type": "discrete"})
    _worker(fleet, "cpu", speed=50.0)
    assert _place(fleet, "gpu") == "a100"
    assert _place(fleet, "gpu") == "lavapipe"  # a100 is busy: a software adapter is a GPU of a kind
    assert _place(fleet, "gpu") == "phone"
    assert _place(fleet, "gpu") is None  # it waits for one of them; "cpu" has none


def test_prefer_fastest_ranks_a_software_adapter_as_no_gpu_and_a_tabs_unknown_speed_last() -> None:
    fleet = Fleet()
    _tab(fleet, "phone", "software")
    _worker(fleet, "lavapipe", speed=10.0, gpu={"active": True, "adapter": "llvmpipe", "adapter_type": "software"})
    _worker(fleet, "cpu", speed=40.0)
    assert _place(fleet, prefer="fastest") == "cpu"
    assert _place(fleet, prefer="fastest") == "lavapipe"  # measured speed 10 beats the tab's unknown one
    assert _place(fleet, prefer="fastest") == "phone"
    fleet = Fleet()
    _worker(fleet, "cpu", speed=40.0)
    _tab(fleet, "laptop", "unknown")  # a tab on a hardware GPU: a GPU first, as any worker's
    assert _place(fleet, prefer="fastest") == "laptop"


def test_a_tabs_worker_claims_no_cpus_memory_speed_or_battery_and_says_they_are_unknown() -> None:
    fleet = Fleet()
    tab = _tab(fleet, "phone", "software")
    assert not {"memory", "cpus", "speed"} & set(tab.traits)
    assert tab.traits["gpu_type"] == "software" and tab.traits["python"] and tab.traits["browser"] == "tab"
    assert describe(tab.traits, ["memory", "cpus", "speed", "vram"]) == (
        "memory unknown, cpus unknown, speed unknown, no vram")
    assert _place(fleet, "memory>=1GB") is None and not fleet.could_run(
        JobRecord("x", b"client", None, [], require=[parse("cpus>=1")]))
    assert "'phone' has memory unknown" in unmatched([parse("memory>=1GB")], fleet.workers(), None)
    assert _place(fleet) == "phone"  # its power is unknown: it is held back by no battery
