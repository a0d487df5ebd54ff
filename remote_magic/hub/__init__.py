"""The hub: one ROUTER port that clients and workers dial; it routes jobs and never unpickles.

Runs inside `remote-worker` (by default) or inside a notebook kernel (`%offload_serve`). ``broker``
is the router (its socket loop, the peers and the table of handlers), ``authenticator`` decides who
may connect, ``records`` holds what it knows of each peer and job, ``fleet`` keeps them, ``placement``
picks a worker for a job, ``scheduler`` takes jobs through their life, ``delivery`` brings a job's
messages to its client or keeps them for a client that collects it (``detached``),
``jupyter_kernels`` routes whole Jupyter kernels, ``throttle`` keeps peers from flooding its log,
``tunnel`` exposes its port through ngrok.
"""

from .broker import Hub

__all__ = ["Hub"]
