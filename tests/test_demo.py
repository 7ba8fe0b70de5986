"""`make demo`'s script: the service with local simulated workers tunes a GEMM and a softmax,
labels every number simulated, and stops cleanly."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path


def test_the_demo_tunes_both_families_and_stops_cleanly(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPETUNE_")}
    env.update(
        XDG_DATA_HOME=str(tmp_path / "data"),
        TMPDIR=str(tmp_path),
        PIPETUNE_SIMULATED_TIME_SCALE="0",
        COLUMNS="120",
    )
    command = [sys.executable, "-m", "pipetune.clients.demo", "--budget", "4"]
    command += ["--runner", "simulated", "--workers", "3"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "gemm 1024x64x2048 on h100, auto, 4/4 trials (0 failed), done" in out
    assert "softmax 12288x128 on h100, auto, 4/4 trials (0 failed), done" in out
    warm = "gemm 1024x64x2048 on h200, auto, 4/4 trials (0 failed), done, warm-started from task 1"
    assert warm in " ".join(out.split())
    assert "TFLOP/s" in out and "GB/s" in out
    assert out.count("runner simulated: analytical model + noise, not measurements") == 3
    # simulated numbers are never called measured (the model's pick has no measurement)
    assert all(m == "-" for m in re.findall(r"measured µs\s*│\s*(\S+)", out)), out
    assert "simulated µs" in out
    # The fleet that measured them: the three local workers, live.
    assert "$ pipetune workers" in out and "3 live, 0 silent, 0 exited" in out
    assert out.rstrip().endswith("stopped cleanly")
    assert not list(tmp_path.glob("pipetune-demo-*"))  # a clean stop removes its work dir
    # Nothing left in the user's data dir (serve generated a worker token there).
    assert not list((tmp_path / "data").rglob("*")), list((tmp_path / "data").rglob("*"))


def test_too_few_simulated_workers_for_every_gpu_is_exit_2():
    command = [sys.executable, "-m", "pipetune.clients.demo", "--runner", "simulated"]
    done = subprocess.run([*command, "--workers", "1"], capture_output=True, text=True)
    assert done.returncode == 2
    assert "--workers: at least 3 with simulated workers" in done.stderr
