"""The `remote-worker` process, installed as ``remote_magic.worker``: it runs on the worker machine.

``cli`` starts a hub and a worker (or joins a hub); ``supervisor`` holds the hub connection and
keeps an executor child process alive; ``executor`` runs each job, with ``outputs`` sending what it
prints and shows; ``gpu`` runs array work as WGSL compute pipelines. Needs the [worker] extra.
"""

WORKER_INSTALL = 'pip install "remote-magic[worker]"'
"""What installs the worker side: `pip install remote-magic` alone is the notebook side."""
