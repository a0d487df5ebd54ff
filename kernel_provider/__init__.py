"""A jupyter_client kernel provisioner that runs a whole ipykernel on a remote-magic worker (not built
yet), installed as ``remote_magic.kernel_provider``; it will run in the Jupyter server or client."""
