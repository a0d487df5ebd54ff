"""Browser tabs as GPU workers (``remote-worker --browser``): runs in the remote-worker process.

``server`` serves the page (``page/``) and the tabs' WebSocket, and checks the secret a tab's link
carries; each tab that joins gets a ``bridge`` that relays its executors' batches of WebGPU calls
(``worker/gpu/tab_device.py``) to it and fails them, naming the tab, when it goes away;
``tab_workers`` makes each joined tab a worker; ``announce`` is what remote-worker prints about the
page. ``worker/tab_protocol.py`` is the format all of them speak. The cell's Python runs in an executor
on this machine; the tab only runs WGSL.
"""
