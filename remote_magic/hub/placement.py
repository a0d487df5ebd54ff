"""Which idle worker takes a job: its requirements, the workers' battery policies, ``prefer``.

No sockets and no queue here: the fleet asks, per job, which of its idle workers may take it and
which one should; and, for a job no worker takes, why it waits (or that none could ever take it).

Battery policy (``remote-worker --on-battery``, ``--min-battery``): a worker on battery with
``never`` takes no job; with ``last`` (the default) it takes a job only when no plugged-in worker
that matches is idle (all busy, or none connected); with ``always`` it is treated as plugged in.
Under ``min_battery`` percent on battery, it takes none whatever its policy. A worker without a
battery counts as plugged in.

A software adapter (a CPU rasteriser: lavapipe, SwiftShader, a browser's fallback adapter), on a
machine or in a browser tab, is what it is: it meets ``gpu`` (its kernels run on an adapter), but a
job that requires ``gpu`` goes to an idle worker with a hardware GPU first, and ``prefer: fastest``
ranks it as no GPU. ``prefer: fastest`` picks, among the idle workers that may take the job, one whose
kernels run on a hardware GPU first, then the one with the highest measured ``speed`` (a short
single-core benchmark each worker runs at start), then the one with the most CPUs; a browser tab's
worker measures neither (they are unknown), so it comes after every worker that did. Plugged-in
workers still come before ``last`` ones on battery.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..wire.requirements import Requirement, describe
from .records import JobRecord, Peer

ON_BATTERY = ("last", "never", "always")
"""What a worker on battery does (``--on-battery``): ``last`` is the default."""

DEFAULT_MIN_BATTERY = 20
"""Below this charge (percent), a worker on battery takes no jobs (``--min-battery``)."""


def battery(worker: Peer) -> dict[str, Any] | None:
    """The worker's battery as of its last heartbeat ({percent, plugged_in}), or None when it has none."""
    state = worker.stats["battery"] if "battery" in worker.stats else worker.capabilities.get("battery")
    return state if isinstance(state, dict) else None


def on_battery(worker: Peer) -> bool:
    state = battery(worker)
    return state is not None and not state.get("plugged_in", True)


def power_hold(worker: Peer) -> str | None:
    """Why the worker takes no job now because of its battery, in words; None when it may take one."""
    if not on_battery(worker):
        return None
    state = battery(worker) or {}
    percent = state.get("percent")
    policy = worker.capabilities.get("on_battery", "last")
    floor = worker.capabilities.get("min_battery", DEFAULT_MIN_BATTERY)
    if policy == "never":
        return f"is on battery ({percent}%) and takes no jobs on battery (--on-battery never)"
    if isinstance(percent, (int, float)) and isinstance(floor, (int, float)) and percent < floor:
        return f"is on battery at {percent}%, under its --min-battery {floor}"
    return None


def _tier(worker: Peer) -> int:
    """0: plugged in (or --on-battery always); 1: on battery, taking jobs only when no plugged one is idle."""
    return 1 if on_battery(worker) and worker.capabilities.get("on_battery", "last") == "last" else 0


def hardware_gpu(worker: Peer) -> bool:
    """Do the worker's kernels run on a GPU that is hardware (not a software adapter)?"""
    return bool(worker.traits.get("gpu")) and worker.traits.get("gpu_type") != "software"


def speed_rank(worker: Peer) -> tuple[int, float, int]:
    """Larger is faster: (kernels run on a hardware GPU, measured speed, CPU count); unknown counts as 0."""
    traits = worker.traits
    speed = traits.get("speed")
    cpus = traits.get("cpus")
    return (int(hardware_gpu(worker)), float(speed) if isinstance(speed, (int, float)) else 0.0,
            int(cpus) if isinstance(cpus, int) else 0)


def fits(job: JobRecord, worker: Peer) -> bool:
    """Could the worker ever run the job: its name, if the job names one, and every requirement."""
    return job.worker_name in (None, worker.name) and all(r.matches(worker.traits) for r in job.require)


def choose(job: JobRecord, idle: Sequence[Peer]) -> Peer | None:
    """The idle worker that should take the job now, or None if it must wait."""
    candidates = [w for w in idle if fits(job, w) and power_hold(w) is None]
    if not candidates:
        return None
    if job.prefer == "fastest":
        return min(candidates, key=lambda w: (_tier(w), tuple(-x for x in speed_rank(w))))
    if any(r.key == "gpu" for r in job.require):  # a software adapter only when no hardware GPU that fits is idle
        return min(candidates, key=lambda w: (_tier(w), not hardware_gpu(w)))
    return min(candidates, key=_tier)  # min is stable: otherwise the first to have joined


def held_by_power(job: JobRecord, workers: Sequence[Peer]) -> str | None:
    """When the job waits only because every worker that fits it is held back by its battery: why, in words."""
    fitting = [w for w in workers if fits(job, w)]
    reasons = [(w, power_hold(w)) for w in fitting]
    if not fitting or any(reason is None for _, reason in reasons):
        return None
    return "; ".join(f"worker {w.name!r} {reason}" for w, reason in reasons)


def unmatched(require: Sequence[Requirement], workers: Sequence[Peer], worker_name: str | None) -> str:
    """Why no worker fits a job: the requirement, and what each worker has."""
    wanted = " ".join(f"--require {str(r)!r}" for r in require)
    if worker_name is not None:
        wanted += f" on worker {worker_name!r}"
    keys = [r.key for r in require]
    each = "; ".join(f"{w.name!r} has {describe(w.traits, keys)}" for w in workers
                     if worker_name in (None, w.name))
    fleet = "; ".join(f"{w.name!r}: {describe(w.traits)}" for w in workers)
    return (f"no connected worker matches {wanted}: {each}. What the fleet has — {fleet}. Require what a worker "
            "has (see %offload_workers), or start one that has it (`remote-worker --label KEY=VALUE` adds a trait "
            "of your own)")
