"""The `remote-worker` process, installed as ``remote_magic.worker``: it runs on the worker machine.

``cli`` starts a hub and a worker (or joins a hub); ``supervisor`` holds the hub connection and
runs each notebook's jobs in its session (``sessions``: one executor child process per notebook,
``executor_processes`` starts and watches them); ``executor`` is that child process, and
``job_runner`` runs each job in it, with ``outputs`` sending what it prints and shows; ``gpu`` runs
array work as WGSL compute pipelines; ``jupyter_kernels`` runs whole Jupyter kernels. Needs the
[worker] extra. ``dask_task`` runs a job with the same ``job_runner`` inside a Dask worker
(``dask://`` connections).
"""

DEFAULT_ORPHAN_GRACE_S = 30.0
"""How long a whole kernel whose notebook is gone lives on (--jupyter-kernel-grace): what it is doing (a checkpoint
being written) may end. Told to the notebook when the kernel starts (``orphan_grace_s``)."""

DEFAULT_MAX_SESSIONS = 8
"""Notebooks whose interpreter a worker keeps at once (--max-sessions); each holds an idle Python with
numpy (tens of MB) and that notebook's imports."""
