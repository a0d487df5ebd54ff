"""The notebook side: the IPython magics and what they show.

Runs in the notebook's kernel (Colab, Jupyter) on top of the client API (``remote_magic.Client``);
imports nothing of the worker, and nothing the notebook side's install lacks (no wgpu, psutil or
ngrok at import time).
"""
