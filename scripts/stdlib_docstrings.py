"""The docstrings (> 200 characters) of this Python's standard library as a .jsonl corpus.

    python scripts/stdlib_docstrings.py OUT.jsonl

`Lib/*.py` and `Lib/*/*.py` (test and site-packages skipped); the text is CPython's (PSF licence).
The measurement corpus of docs/real-teacher.md, "Clone terms on real activations".
"""

from __future__ import annotations

import ast
import json
import sys
import sysconfig
from pathlib import Path

DOC_NODES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def docstrings(root: Path, min_chars: int = 200):
    for path in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
        if "test" in path.parts or "site-packages" in path.parts:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            doc = ast.get_docstring(node) if isinstance(node, DOC_NODES) else None
            if doc and len(doc) > min_chars:
                yield doc


def main() -> None:
    n = 0
    with open(sys.argv[1], "w") as f:
        for doc in docstrings(Path(sysconfig.get_paths()["stdlib"])):
            f.write(json.dumps({"text": doc}) + "\n")
            n += 1
    print(f"{n} docstrings -> {sys.argv[1]}")


if __name__ == "__main__":
    main()
