"""constraints.txt (the versions the suite was last green with) installs with gpupack: every dependency that
pyproject.toml declares, extras included, is pinned there, and every pin is inside the range pyproject allows (a pin
outside it would make `pip install -c constraints.txt -e '.[test]'` fail to resolve)."""
from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "constraints.txt"


def _declared() -> list[Requirement]:
    """pyproject.toml's own (an editable install's metadata keeps the ranges of the day it was installed)."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11's")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {}).values()
    return [Requirement(r) for r in [*project["dependencies"], *(r for extra in extras for r in extra)]]


def _pins() -> dict[str, Version]:
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is no exact pin (name==version)"
            pins[canonicalize_name(name)] = Version(version)
    return pins


def test_every_dependency_of_gpupack_is_pinned_inside_its_range():
    pins = _pins()
    declared = _declared()
    assert any(canonicalize_name(r.name) == "cloudpickle" for r in declared)  # the metadata was read
    for req in declared:
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} ({req}) is not pinned in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), \
            f"constraints.txt pins {req.name}=={pins[name]}, outside pyproject's {req.specifier}"


def test_pins_carry_no_local_build_label():
    """A site's wheel has its own local label (torch 2.13.0+cu126...): a pin of one build would refuse the others."""
    assert not [v for v in _pins().values() if v.local], CONSTRAINTS.read_text()
