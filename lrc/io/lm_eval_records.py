"""lm-eval's own record of an evaluation, kept beside `lrc evaluate`'s summary JSON.

A directory ``<summary stem>.lm_eval/`` holds ``results.json`` (what ``simple_evaluate``
returned, less the samples: configs, versions, every metric and stderr) and one
``samples_<task>.jsonl`` per task (lm-eval's per-document log: the document, its hashes, the
log-likelihoods and each metric's value for that document). From these an evaluation can be
re-scored, set beside other lm-eval outputs, or compared item by item (`lrc compare`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lrc.errors import LRCError
from lrc.io.atomic import atomic_dir

RESULTS_FILE = "results.json"


def records_dir(summary: str | Path) -> Path:
    """Where the records of the summary JSON ``summary`` lie: ``eval/a.json`` -> ``eval/a.lm_eval``."""
    summary = Path(summary)
    return summary.with_name(summary.stem + ".lm_eval")


def summary_records(summary_path: str | Path, summary: dict[str, Any]) -> Path:
    """The records directory of a loaded summary JSON: the one it names, else the one beside it."""
    recorded = summary.get("lm_eval_records")
    return Path(summary_path).parent / recorded if recorded else records_dir(summary_path)


def _json_default(value: Any) -> Any:
    # lm-eval's results hold numpy scalars, sets, dtypes and callables among its configs.
    if hasattr(value, "item") and callable(value.item):
        try:
            return value.item()
        except (TypeError, ValueError):
            pass
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def write_records(results: dict[str, Any] | None, into: Path) -> Path:
    """Write lm-eval's ``results`` (``None``: no task ran, an empty record says so) whole into ``into``."""
    results = dict(results or {"results": {}, "note": "no lm-eval task ran (suite none)"})
    samples = results.pop("samples", None) or {}
    with atomic_dir(into) as tmp:
        (tmp / RESULTS_FILE).write_text(json.dumps(results, indent=1, default=_json_default, sort_keys=True) + "\n")
        for task, rows in samples.items():
            with open(tmp / f"samples_{task}.jsonl", "w", encoding="utf-8") as f:
                for row in rows:
                    f.write(json.dumps(row, default=_json_default, sort_keys=True) + "\n")
    return into


def read_samples(directory: Path, task: str) -> list[dict[str, Any]]:
    """lm-eval's per-document log of ``task`` in a records directory."""
    path = Path(directory) / f"samples_{task}.jsonl"
    if not path.is_file():
        have = sorted(p.name.removeprefix("samples_").removesuffix(".jsonl") for p in Path(directory).glob("samples_*"))
        raise LRCError(f"{directory}: no per-document log of task {task!r} ({path.name}); it has: {have or 'none'}")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def item_scores(rows: list[dict[str, Any]], metric: str, where: str) -> dict[int, tuple[float, str]]:
    """Per document: (its ``metric`` value, the hash of document and prompt), keyed by ``doc_id``."""
    scores = {}
    for row in rows:
        if metric not in row:
            raise LRCError(f"{where}: document {row.get('doc_id')} has no per-document {metric!r} "
                           f"(it has {sorted(k for k in row if isinstance(row[k], (int, float)))})")
        scores[int(row["doc_id"])] = (float(row[metric]), f"{row.get('doc_hash')}/{row.get('prompt_hash')}")
    return scores
