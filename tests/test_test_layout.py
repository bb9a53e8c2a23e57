"""No test module imports another: what tests share lives in helper modules (tests/helpers.py,
tests/launch.py, tests/workflow_helpers.py, ...), so a test module can be run, edited or removed
on its own. Checked by reading each test_*.py under tests/ (the folders mirror lrc/'s) and
tests/conftest.py with `ast`, imports inside functions included.

And the folders: every test module lies in the folder of the layer it tests, or at the top for the
project as a whole."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def _is_test_module(dotted: str) -> bool:
    """``tests.test_x``, ``tests.training.test_x`` (or ``....test_x.y``), or ``test_x`` as a script
    beside it imports it: a dotted name with a ``test_`` part."""
    return any(part.startswith("test_") for part in dotted.split("."))


def imports_of_test_modules(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, module) of each import of a test module in ``source``: ``import tests.test_x``,
    ``from tests.test_x import ...``, ``from tests import test_x``, ``from .test_x import ...``,
    ``from . import test_x`` and their forms without the package."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if _is_test_module(a.name)]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level or base.split(".")[0] == "tests":  # from . / from tests(.x): the names may be modules
                prefix = "." * node.level + (f"{base}." if base else "")
                found += [(node.lineno, prefix + a.name) for a in node.names if _is_test_module(a.name)]
            if base and _is_test_module(base):
                found.append((node.lineno, "." * node.level + base))
    return sorted(found)


def _checked_files() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py")) + [TESTS / "conftest.py"]


def test_no_test_module_imports_another_test_module():
    offences = [f"{path.relative_to(TESTS.parent)}:{line}: imports {module}"
                for path in _checked_files()
                for line, module in imports_of_test_modules(path.read_text(), str(path))]
    assert not offences, ("test modules import test modules (move what they share into a helper module, "
                          "e.g. tests/helpers.py):\n" + "\n".join(offences))


FORMS = {
    "from-tests-test": ("from tests.test_fsdp import make_world", [(1, "tests.test_fsdp")]),
    "from-a-test-folder": ("from tests.training.test_fsdp import placement", [(1, "tests.training.test_fsdp")]),
    "from-a-test-folder-import": ("from tests.training import test_zero", [(1, "tests.training.test_zero")]),
    "inside-a-function": ("def f():\n    from tests.test_workflow_config import default_config",
                          [(2, "tests.test_workflow_config")]),
    "import-as": ("import tests.test_multiprocess as m", [(1, "tests.test_multiprocess")]),
    "from-tests-import": ("from tests import helpers, test_zero", [(1, "tests.test_zero")]),
    "relative": ("from .test_recompute import fit", [(1, ".test_recompute")]),
    "relative-module": ("from . import test_recompute", [(1, ".test_recompute")]),
    "script-path": ("import test_multiprocess", [(1, "test_multiprocess")]),
    "helpers-only": ("from tests.helpers import make_teacher\nfrom tests.launch import run\nimport pytest", []),
    "other-packages": ("from lrc.commands import test_like\nfrom tests.workflow_helpers import snakemake", []),
    "a-test-folder-itself": ("from tests import training\nimport tests.io", []),
}


@pytest.mark.parametrize("source, found", list(FORMS.values()), ids=list(FORMS))
def test_the_check_finds_every_form_of_a_test_module_import(source, found):
    assert imports_of_test_modules(source) == found


def test_the_test_folders_are_the_package_folders():
    """tests/<folder>/ for lrc/<folder>/: a test module lies beside the layer it tests, so a change to
    the method runs tests/method/ first. At the top: the project as a whole (layers, README, configs)."""
    package = TESTS.parent / "lrc"
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders and folders <= {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    assert all((TESTS / f / "__init__.py").is_file() for f in folders)  # unique module names: tests.<folder>.test_x
