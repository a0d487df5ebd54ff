"""The remote-worker process: hub connection, supervised executor, GPU."""
