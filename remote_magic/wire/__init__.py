"""The wire: what travels between notebook, hub and worker, and how it is secured.

Imported by every process (the notebook's client, the hub, the worker and its executor); it owns
no sockets of its own except a connection's, and never imports the hub, the notebook side or the
worker. ``protocol`` frames messages; ``serialization`` (with ``definitions`` and ``portable``)
turns values into frames and back across Python and library versions; ``versions`` says what
differs between two sides; ``cellcode`` is the cell contract both sides apply (what a cell reads,
what it assigns, its last expression); ``connection``, ``auth``, ``keys``, ``tokens`` and
``addresses`` reach a hub over CurveZMQ.
"""
