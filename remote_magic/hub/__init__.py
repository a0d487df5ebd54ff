"""The hub: one ROUTER port that clients and workers dial; it routes jobs and never unpickles.

Runs inside `remote-worker` (by default) or inside a notebook kernel (`%offload_serve`). ``broker``
is the router and its message handlers, ``fleet`` the bookkeeping of peers and jobs, ``throttle``
keeps peers from flooding its log, ``tunnel`` exposes its port through ngrok.
"""

from .broker import Hub

__all__ = ["Hub"]
