"""User text is printed as written: a task name with ':train:' (rich's emoji code for a train) and '[bold]' (rich's
markup) reads the same in gpupack's report, never as an emoji or a style."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
APP = REPO / "tests" / "hydra_app" / "app.py"
NAME = "x:train:[bold]y"


@pytest.mark.slow
def test_a_task_name_with_emoji_codes_and_markup_prints_as_written(tmp_path, subprocess_env):
    sweep_dir = tmp_path / "mr"
    proc = subprocess.run([sys.executable, str(APP), "-m", "hydra/launcher=gpupack_local", "hydra.launcher.pack=2",
                           "hydra.launcher.stream=off",
                           f"hydra.job.name='{NAME}'", "lr=0.1,0.2", "sleep_s=0", f"hydra.sweep.dir={sweep_dir}"],
                          capture_output=True, text=True, cwd=tmp_path, env=subprocess_env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = subprocess.run([sys.executable, "-m", "gpupack", "collect", str(sweep_dir), "--no-plots", "--goal", "min"],
                         capture_output=True, text=True, env=subprocess_env, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert f"Best packing factor for hydra:{NAME} on local" in text, text  # a bold line of gpupack's own
    assert f"hydra:{NAME}: lr=0.1  return_value=1" in text, text  # the ranking's plain lines
    assert "\N{STEAM LOCOMOTIVE}" not in text and "\N{RAILWAY CAR}" not in text and "\N{TRAIN}" not in text
