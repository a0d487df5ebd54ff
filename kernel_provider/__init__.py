"""A jupyter_client kernel provisioner that runs a whole ipykernel on a remote-magic worker (not built yet)."""
