"""The house rules of `lrc/`: layers that point one way, no import cycle, small functions.

docs/architecture.md ("Layers") draws the same picture. Each rule is checked twice where it
can be: statically, over every `import` in the source (lazy ones inside functions too), and
dynamically, by importing a layer in a fresh interpreter and looking at `sys.modules`.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lrc"

# The folders of `lrc/` are its layers; a module may import its own folder and the folders
# listed here. "top" is the package's own modules (errors, names, options and `lrc` itself).
ALLOWED = {
    "top": {"top"},
    "io": {"top", "io"},
    "world": {"top", "io", "world"},
    "method": {"top", "io", "method"},
    "training": {"top", "io", "method", "training"},  # the loop itself knows no arm (tested below)
    "analysis": {"top", "io", "analysis"},
    "commands": {"top", "io", "world", "method", "training", "analysis"},  # never another command
    "cli": {"top"},  # the front door imports command modules lazily, by name, from COMMANDS
    "workflow": {"top", "cli", "workflow"},  # the config checks find each command's dataclass through COMMANDS
}
TOP_MODULES = {"lrc", "lrc.errors", "lrc.names", "lrc.options"}
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 450


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    if module in TOP_MODULES:
        return "top"
    if module == "lrc.cli":
        return "cli"
    return module.split(".")[1]


def sources() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path) -> set[str]:
    """Every `lrc` module that ``path`` imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "lrc"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "lrc":
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}  # `from lrc.training import loop` imports a module
    known = sources()
    return {m for m in found if m in known}


def import_graph() -> dict[str, set[str]]:
    return {name: imports_of(path) - {name} for name, path in sources().items()}


def test_no_import_cycle():
    graph = import_graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            # a package importing its own submodules is not a cycle in the layering sense
            if nxt.startswith(node + "."):
                continue
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_every_import_points_down_the_layers():
    wrong = []
    for module, targets in import_graph().items():
        mine = layer_of(module)
        for target in targets:
            upward = layer_of(target) not in ALLOWED[mine]
            command_to_command = mine == layer_of(target) == "commands"
            if (upward or command_to_command) and not target.startswith(module + "."):
                wrong.append(f"{module} ({mine}) imports {target} ({layer_of(target)})")
    assert not wrong, "\n".join(sorted(wrong))


def test_evaluation_does_not_import_the_tiny_world():
    assert not any(t.startswith("lrc.world") for t in import_graph()["lrc.commands.evaluate"])


ARM_MODULES = ("lrc.cli", "lrc.method.student", "lrc.method.reach", "lrc.method.clone", "lrc.method.spectral")


@pytest.mark.slow
@pytest.mark.parametrize(
    "module, forbidden",
    [
        ("lrc.training.loop", ARM_MODULES),
        ("lrc.commands.pretrain", ARM_MODULES),
        ("lrc.commands.sft", ARM_MODULES),
        ("lrc.method.student", ("lrc.cli", "lrc.training.loop", "lrc.training.checkpoint")),
        ("lrc.method.clone", ("lrc.cli", "lrc.training.loop", "lrc.training.checkpoint")),
        ("lrc.method.losses", ("lrc.cli", "lrc.method.student", "lrc.training.loop")),
    ],
)
def test_importing_a_layer_loads_nothing_above_it(module, forbidden):
    code = (f"import json, sys; import {module}; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('lrc'))))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    loaded = set(json.loads(result.stdout))
    assert not loaded & set(forbidden), f"import {module} loaded {sorted(loaded & set(forbidden))}"


def test_functions_and_modules_are_small():
    long = []
    for name, path in sources().items():
        text = path.read_text()
        if (n := len(text.splitlines())) > MAX_MODULE_LINES:
            long.append(f"module {name}: {n} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = node.end_lineno - node.lineno + 1
                if size > MAX_FUNCTION_LINES:
                    long.append(f"function {name}.{node.name} (line {node.lineno}): {size} lines")
    assert not long, "\n".join(long)


def test_the_package_is_its_folders():
    """`ls lrc/` shows the architecture: the layer folders and the few top modules, nothing else."""
    entries = {p.name for p in PACKAGE.iterdir() if p.name != "__pycache__"}
    assert entries == {"__init__.py", "cli.py", "errors.py", "names.py", "options.py", *(set(ALLOWED) - {"top", "cli"})}
    assert {layer_of(m) for m in sources()} == set(ALLOWED)
