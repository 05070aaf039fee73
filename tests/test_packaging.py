"""The config tree and the MNIST data are found from an installed wheel, not only from a checkout."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_wheel_ships_conf_and_data_and_finds_them(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(REPO),
                    "-w", str(tmp_path)], check=True, timeout=300, capture_output=True)
    wheel = next(tmp_path.glob("gpupack-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"gpupack/conf/config.yaml", "gpupack/conf/sweep/mnist_pack.yaml", "gpupack/conf/cluster/local.yaml",
            "gpupack/job/workloads/data/mnist/train-images-idx3-ubyte.gz",
            "gpupack/job/workloads/data/mnist/t10k-labels-idx1-ubyte.gz",
            "gpupack/conf/sweep/command.yaml", "gpupack/job/workloads/command.py", "gpupack/core/result.py",
            "hydra_plugins/gpupack_launcher/config.py", "hydra_plugins/gpupack_launcher/gpupack_launcher.py"} <= names
    # Every module of every layer ships, and nothing but gpupack and its Hydra plugin folder is installed at the top
    # level (a top-level `jobs` package once let a user's jobs.py shadow the built-in workloads).
    modules = {str(m.relative_to(REPO)) for m in (REPO / "gpupack").rglob("*.py")}
    assert modules <= names, sorted(modules - names)
    assert {n.split("/")[0] for n in names if not n.startswith("gpupack-")} == {"gpupack", "hydra_plugins"}
    # hydra_plugins is a namespace shared with every Hydra plugin: an __init__.py there would hide the others.
    assert "hydra_plugins/__init__.py" not in names
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, timeout=300, capture_output=True)
    code = ("import gpupack, gpupack.job.workloads._mnist_data as d; "
            "from gpupack.sweep.setup.compose import config_dir; "
            "print(gpupack.__file__); print(config_dir()); print(d.load(None).source)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, timeout=120, check=True).stdout
    lines = out.splitlines()
    assert lines[0].startswith(str(site)) and lines[1] == str(site / "gpupack" / "conf")
    assert "60000 train, 10000 test" in lines[2]


@pytest.mark.slow
def test_installed_wheel_registers_the_hydra_launchers(tmp_path):
    """Installed (not from a checkout), Hydra finds gpupack_local and gpupack_slurm beside other plugins."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(REPO),
                    "-w", str(tmp_path)], check=True, timeout=300, capture_output=True)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                    str(next(tmp_path.glob("gpupack-*.whl")))], check=True, timeout=300, capture_output=True)
    app = tmp_path / "app.py"
    app.write_text("import hydra, hydra_plugins.gpupack_launcher as g\nprint(g.__file__)\n"
                   "@hydra.main(version_base=None)\ndef main(cfg):\n    pass\nmain()\n")
    out = subprocess.run([sys.executable, str(app), "--info", "plugins"], capture_output=True, text=True,
                         cwd=tmp_path, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, timeout=120,
                         check=True).stdout
    assert out.splitlines()[0].startswith(str(site))  # the wheel's copy, not this checkout's
    assert "GpupackLocalLauncher" in out and "GpupackSlurmLauncher" in out and "BasicLauncher" in out


def test_ci_runs_the_readmes_test_command_as_written():
    """The README's one test command is what CI runs: a line changed in one place only would make the README's
    promise untrue."""
    readme = (REPO / "README.md").read_text()
    block = readme.split("## Test it", 1)[1].split("```bash\n", 1)[1].split("\n```", 1)[0].strip()
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines()
          if line and not line.startswith(("#", "set ", "cd "))]
    assert ci == [block]


def test_every_package_folder_of_gpupack_ships_in_the_wheel():
    """pyproject lists the packages by name: a folder added without its line would install a gpupack that cannot
    import itself (a plain pip install ., not the editable one the tests run)."""
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "gpupack").rglob("__init__.py")}
    assert folders - listed == set()
