"""The main job: start a local remote-worker, offload notebook cells to it, show what came back.

Run it with ``bash scripts/demo.sh`` (which installs everything first) or, once installed,
``python examples/demo.py``. The cells run through a real IPython shell, exactly as in a notebook.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from IPython.core.interactiveshell import InteractiveShell

CELLS = [
    "%%offload\nimport numpy as np, platform\nc = a @ b\nwhere = platform.node()\n"
    "print('worker', where, 'computed c with shape', c.shape)\nfloat(c.sum())",
    "%%offload\nimport time\nfor step in range(3):\n    print('step', step, flush=True)\n    time.sleep(0.2)\n"
    "done = True",
    "%%offload\nstats = {'mean': float(c.mean()), 'std': float(c.std())}\n"
    "raise ValueError('this error happens on the worker')",
]


def start_worker(folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    token_file = folder / "token"
    env = {**os.environ, "REMOTE_MAGIC_HOME": str(folder / "home")}
    process = subprocess.Popen(["remote-worker", "--listen", "127.0.0.1:0", "--token-file", str(token_file)],
                               env=env, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not token_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("remote-worker did not start; run `remote-worker -v` to see why")
        time.sleep(0.1)  # waiting for the worker to write its token file
    return process, token_file.read_text().strip()


def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        print("Starting a local remote-worker ...")
        worker, token = start_worker(Path(folder))
        try:
            shell = InteractiveShell.instance()
            shell.run_line_magic("load_ext", "remote_magic")
            shell.run_line_magic("offload_connect", token)
            rng = np.random.default_rng(0)
            shell.user_ns.update(a=rng.standard_normal((300, 200)), b=rng.standard_normal((200, 100)))
            for cell in CELLS:
                print("\n" + "-" * 72 + "\n" + cell + "\n" + "-" * 72)
                result = shell.run_cell(cell)
                print(f"=> {'ok' if result.success else 'raised ' + type(result.error_in_exec).__name__}")
            ns = shell.user_ns
            print("\nBack in the notebook's namespace:")
            same = np.allclose(ns["c"], ns["a"] @ ns["b"])
            print(f"  c: {ns['c'].shape} {ns['c'].dtype}, equal to a @ b locally: {same}")
            print(f"  where: {ns['where']!r}, done: {ns['done']}")
            print(f"  stats: {ns['stats']} (set before the failing cell raised, as a local run keeps it)")
            print(shell.run_line_magic("offload_workers", ""))
            shell.run_line_magic("offload_disconnect", "")
        finally:
            worker.terminate()
            worker.wait(15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
