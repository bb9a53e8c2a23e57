"""constraints.txt, the package versions the README's numbers were measured with, agrees with
pyproject.toml's ranges, and the README's install commands and CI use it."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
INSTALLED_EXTRAS = ("workflow", "test", "real")  # what the README's test command installs


def pins() -> dict[str, str]:
    found = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version, f"constraints.txt: {line!r} is not an exact pin (name==version)"
            found[canonicalize_name(name)] = version
    return found


def direct_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = project["dependencies"] + [r for extra in INSTALLED_EXTRAS
                                        for r in project["optional-dependencies"][extra]]
    return [Requirement(r) for r in listed]


def test_every_direct_dependency_is_pinned_inside_its_range():
    pinned = pins()
    for req in direct_requirements():
        name = canonicalize_name(req.name)
        assert name in pinned, f"constraints.txt pins no version of {req.name} (pyproject.toml: {req})"
        assert req.specifier.contains(pinned[name], prereleases=True), \
            f"constraints.txt: {req.name}=={pinned[name]} is outside pyproject.toml's {req}"


def test_torch_pin_carries_no_build_label():
    # A local label (+cpu) would refuse a GPU user's CUDA build of the same version.
    assert "+" not in pins()["torch"]


def test_readme_commands_and_ci_install_with_the_constraints():
    """Every install of the project's extras in the README (its two set-up commands among them)
    and in CI pins the versions."""
    installs = {name: re.findall(r"pip install[^&\n`]*-e '\.\[[a-z,]+\]'", (ROOT / name).read_text())
                for name in ("README.md", ".ci/run")}
    assert len(installs["README.md"]) >= 2 and installs[".ci/run"], installs
    for name, found in installs.items():
        assert all("-c constraints.txt" in cmd for cmd in found), (name, found)
