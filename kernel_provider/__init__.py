"""A whole Jupyter kernel on a remote-magic worker, through the hub's one port.

- ``provisioner``: ``RemoteKernelProvisioner``, jupyter_client's provisioner (entry point
  ``remote-magic-provisioner``), run where Jupyter runs;
- ``relay``: the process it starts, which relays the kernel's five channels over the hub connection;
- ``kernelspec``: ``remote-worker kernelspec install|list|remove``.

The worker's half is ``remote_magic.worker.jupyter_kernels``. docs/kernel.md says how to set it up.
"""
