"""A real Dask cluster on 127.0.0.1, for the tests that offload to Dask (tests/notebook/test_dask.py,
tests/notebook/test_engines.py)."""

from __future__ import annotations

import logging
import sys
from typing import Any


def local_cluster(workers: int) -> Any:
    """A real Dask scheduler and worker processes (1 thread each) on 127.0.0.1 only, without a dashboard;
    the scheduler's own HTTP endpoint on a free port (not Dask's fixed 8787, which another test may hold)."""
    import distributed

    main = sys.modules["__main__"]
    if not hasattr(main, "__spec__"):  # an IPython shell made earlier in this process put its own __main__ in
        main.__spec__ = None  # sys.modules, without the __spec__ multiprocessing's spawn reads: as for `python -c`
    return distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                                    dashboard_address=None, silence_logs=logging.CRITICAL,
                                    scheduler_kwargs={"dashboard": False, "dashboard_address": "127.0.0.1:0"})


def dask_address(cluster: Any) -> str:
    """What ``connect`` and ``%offload_connect`` take for the cluster's scheduler: ``dask://HOST:PORT``."""
    return "dask://" + str(cluster.scheduler_address).removeprefix("tcp://")
