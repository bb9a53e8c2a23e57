"""constraints.txt, the package versions the README's numbers were measured with, agrees with
pyproject.toml's ranges, and the README's install commands and CI use it."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib
import yaml
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
    and in CI pins the versions; only the GPU section's keeps the user's own torch."""
    texts = {name: (ROOT / name).read_text() for name in ("README.md", ".ci/run")}
    texts["README.md"] = re.sub(r"\n## GPU users.*?(?=\n## )", "", texts["README.md"], flags=re.S)
    installs = {name: re.findall(r"pip install[^&\n`]*-e '\.\[[a-z,]+\]'", text) for name, text in texts.items()}
    assert len(installs["README.md"]) >= 2 and installs[".ci/run"], installs
    for name, found in installs.items():
        assert all("-c constraints.txt" in cmd for cmd in found), (name, found)


def test_conda_files_follow_pyproject_and_the_constraints():
    """The rules' conda environment lists pyproject.toml's dependencies; environment.yml installs
    the project with the constraints and the extras CI installs."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    rules_env = yaml.safe_load((ROOT / "workflow" / "envs" / "lrc.yaml").read_text())
    pip_lists = [d["pip"] for d in rules_env["dependencies"] if isinstance(d, dict)]
    assert [sorted(pip_lists[0])] == [sorted(project["dependencies"])], \
        "workflow/envs/lrc.yaml's pip list differs from pyproject.toml's dependencies"
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "-c constraints.txt" in pip and f"-e .[{','.join(INSTALLED_EXTRAS)}]" in pip, pip


def _stated_torch(into: Path, version: str) -> Path:
    """A wheel that says it is torch ``version`` and holds nothing: what pip's resolver sees of an
    already chosen torch build, without a download."""
    tag = f"torch-{version}.dist-info"
    files = {f"{tag}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
             f"{tag}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    wheel = into / f"torch-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
        archive.writestr(f"{tag}/RECORD", "".join(f"{name},,\n" for name in files) + f"{tag}/RECORD,,\n")
    return wheel


@pytest.mark.parametrize("version, accepted", [("2.6.0", True), ("1.13.1", False)])
def test_pip_keeps_a_users_torch_of_another_2x_version(tmp_path, version, accepted):
    """`pip install -e '.[workflow]'` without the constraints, next to a torch of another version
    (pip's own resolver, offline: --dry-run, the stated torch as the only wheel on offer, everything
    else as installed here). A torch 2.x is taken; one outside the range is refused."""
    _stated_torch(tmp_path, version)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--find-links", str(tmp_path),
         "--no-build-isolation", "--disable-pip-version-check", "-e", f"{ROOT}[workflow]", f"torch=={version}"],
        capture_output=True, text=True, cwd=tmp_path)
    told = result.stdout + result.stderr
    if accepted:
        assert result.returncode == 0, told
        assert f"torch-{version}" in told, told
    else:
        assert result.returncode != 0 and "torch" in told and "conflict" in told.lower(), told
