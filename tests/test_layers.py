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

# Layer -> modules. A module may import its own layer and the layers listed in ALLOWED.
LAYERS = {
    "base": {"lrc", "lrc.errors", "lrc.names", "lrc.options", "lrc.atomic", "lrc.provenance", "lrc.stats"},
    "io": {"lrc.hf", "lrc.losses", "lrc.fused_loss", "lrc.optim", "lrc.tokens", "lrc.suites"},
    "method": {"lrc.spectral", "lrc.reach", "lrc.student", "lrc.clone", "lrc.objectives"},
    "loop": {"lrc.checkpoint", "lrc.steplog", "lrc.sharding", "lrc.recompute", "lrc.train"},
    "cli": {"lrc.cli"},
    "workflow": {"lrc.workflow_config", "lrc.workflow_claims"},
}
ALLOWED = {
    "base": {"base"},
    "io": {"base", "io"},
    "method": {"base", "io", "method"},
    "loop": {"base", "io", "loop"},
    "commands": {"base", "io", "method", "loop", "commands"},
    "cli": {"base"},  # the front door imports command modules lazily, by name, from COMMANDS
    "workflow": {"base", "cli", "workflow"},  # the workflow's config checks find each command's dataclass through COMMANDS
}
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 450


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    for layer, members in LAYERS.items():
        if module in members:
            return layer
    return "commands"


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
            # `from lrc import checkpoint` imports the module lrc.checkpoint
            found |= {f"{node.module}.{a.name}" for a in node.names if (PACKAGE / f"{a.name}.py").exists() and node.module == "lrc"}
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
            if layer_of(target) not in ALLOWED[mine] and not target.startswith(module + "."):
                wrong.append(f"{module} ({mine}) imports {target} ({layer_of(target)})")
    assert not wrong, "\n".join(sorted(wrong))


def test_evaluation_does_not_import_the_tiny_world():
    assert not any(t.startswith("lrc.world") for t in import_graph()["lrc.evaluate"])


@pytest.mark.parametrize(
    "module, forbidden",
    [
        ("lrc.train", ("lrc.cli", "lrc.student", "lrc.reach", "lrc.clone", "lrc.spectral")),
        ("lrc.pretrain", ("lrc.cli", "lrc.student", "lrc.reach", "lrc.clone", "lrc.spectral")),
        ("lrc.sft", ("lrc.cli", "lrc.student", "lrc.reach", "lrc.clone", "lrc.spectral")),
        ("lrc.student", ("lrc.cli", "lrc.train", "lrc.checkpoint")),
        ("lrc.clone", ("lrc.cli", "lrc.train", "lrc.checkpoint")),
        ("lrc.losses", ("lrc.cli", "lrc.student", "lrc.train")),
    ],
)
def test_importing_a_layer_loads_nothing_above_it(module, forbidden):
    code = f"import json, sys; import {module}; print(json.dumps(sorted(m for m in sys.modules if m.startswith('lrc'))))"
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


def test_the_layer_table_names_real_modules():
    known = set(sources())
    assert set().union(*LAYERS.values()) <= known, sorted(set().union(*LAYERS.values()) - known)
