"""examples/demo.py, the main job, runs end to end and shows what came back."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).parents[2] / "examples" / "demo.py"


def test_demo_offloads_cells_and_shows_the_results(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(DEMO)], capture_output=True, text=True, timeout=180,
                            cwd=tmp_path, env={**os.environ, "REMOTE_MAGIC_GPU": "off"})
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "computed c with shape (300, 100)" in out
    assert "step 0\nstep 1\nstep 2" in out
    assert "ValueError: this error happens on the worker" in out + result.stderr
    assert "equal to a @ b locally: True" in out
    assert "stats: {'mean': " in out and "as a local run keeps it" in out
