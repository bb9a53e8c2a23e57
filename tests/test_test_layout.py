"""No test module imports another: what tests share lives in helper modules (tests/helpers.py,
tests/launch.py, tests/workflow_helpers.py, ...), so a test module can be run, edited or removed
on its own. Checked by reading each tests/test_*.py and tests/conftest.py with `ast`, imports
inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def _is_test_module(dotted: str) -> bool:
    """``tests.test_x`` (or ``tests.test_x.y``), or ``test_x`` as a script beside it imports it."""
    parts = dotted.split(".")
    if parts[0] == "tests":
        parts = parts[1:]
    return bool(parts) and parts[0].startswith("test_")


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
            if node.level or base == "tests":  # from . / from tests: the names may be modules
                prefix = "." * node.level + (f"{base}." if base else "")
                found += [(node.lineno, prefix + a.name) for a in node.names if _is_test_module(a.name)]
            if base and _is_test_module(base):
                found.append((node.lineno, "." * node.level + base))
    return sorted(found)


def _checked_files() -> list[Path]:
    return sorted(TESTS.glob("test_*.py")) + [TESTS / "conftest.py"]


def test_no_test_module_imports_another_test_module():
    offences = [f"tests/{path.name}:{line}: imports {module}"
                for path in _checked_files()
                for line, module in imports_of_test_modules(path.read_text(), str(path))]
    assert not offences, ("test modules import test modules (move what they share into a helper module, "
                          "e.g. tests/helpers.py):\n" + "\n".join(offences))


FORMS = {
    "from-tests-test": ("from tests.test_fsdp import make_world", [(1, "tests.test_fsdp")]),
    "inside-a-function": ("def f():\n    from tests.test_workflow_config import default_config",
                          [(2, "tests.test_workflow_config")]),
    "import-as": ("import tests.test_multiprocess as m", [(1, "tests.test_multiprocess")]),
    "from-tests-import": ("from tests import helpers, test_zero", [(1, "tests.test_zero")]),
    "relative": ("from .test_recompute import fit", [(1, ".test_recompute")]),
    "relative-module": ("from . import test_recompute", [(1, ".test_recompute")]),
    "script-path": ("import test_multiprocess", [(1, "test_multiprocess")]),
    "helpers-only": ("from tests.helpers import make_teacher\nfrom tests.launch import run\nimport pytest", []),
    "other-packages": ("from lrc.commands import test_like\nfrom tests.workflow_helpers import snakemake", []),
}


@pytest.mark.parametrize("source, found", list(FORMS.values()), ids=list(FORMS))
def test_the_check_finds_every_form_of_a_test_module_import(source, found):
    assert imports_of_test_modules(source) == found
