"""Two models on the same lm-eval items: per task, the paired difference and its interval; and on
the same held-out rows: per token-level measure, the paired difference and its bootstrap interval.

The items are paired by lm-eval's ``doc_id`` within each task (a group's subtasks each count), and
must be the same documents asked the same way: the document and prompt hashes lm-eval logs must
agree, or the comparison is refused. The interval is the paired t interval of the per-item
differences (for 0/1 accuracies with hundreds of items, the normal interval of McNemar's setting).

The held-out measures (`lrc evaluate --heldout`: per-token cross-entropy, and with a teacher the KL
to it and the top-1 agreement with it) are paired by row: each row is a block of consecutive
held-out tokens, so resampling rows (:func:`lrc.analysis.stats.paired_bootstrap`) keeps the
dependence between neighbouring tokens that a per-token interval would ignore.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from lrc.analysis.stats import LEVEL, paired_bootstrap, paired_t_pvalue, t_interval
from lrc.errors import LRCError
from lrc.io.lm_eval_records import item_scores, read_samples


def task_logs(records: Path, task: str) -> list[str]:
    """The per-document logs of ``task`` in a records directory: its own, or its subtasks' (a group)."""
    own = records / f"samples_{task}.jsonl"
    if own.is_file():
        return [task]
    subtasks = sorted(p.name.removeprefix("samples_").removesuffix(".jsonl")
                      for p in records.glob(f"samples_{task}_*.jsonl"))
    if not subtasks:
        read_samples(records, task)  # raises, naming what the directory has
    return subtasks


def paired_scores(a: tuple[str, Path], b: tuple[str, Path], task: str, metric: str) -> list[tuple[float, float]]:
    """(score under A, score under B) for every item of ``task``, paired by document."""
    (a_name, a_dir), (b_name, b_dir) = a, b
    logs = task_logs(a_dir, task)
    if logs != task_logs(b_dir, task):
        raise LRCError(f"task {task}: {a_name} and {b_name} logged different subtasks")
    pairs = []
    for log in logs:
        left = item_scores(read_samples(a_dir, log), metric, f"{a_name} {log}")
        right = item_scores(read_samples(b_dir, log), metric, f"{b_name} {log}")
        if set(left) != set(right):
            only = sorted(set(left) ^ set(right))[:5]
            raise LRCError(f"task {log}: {a_name} has {len(left)} documents and {b_name} {len(right)}; "
                           f"e.g. doc_id {only} is in one only (evaluate both with the same --limit)")
        for doc in sorted(left):
            if left[doc][1] != right[doc][1]:
                raise LRCError(f"task {log}, doc_id {doc}: the document or prompt differs between {a_name} and "
                               f"{b_name} (lm-eval's hashes {left[doc][1]} vs {right[doc][1]})")
            pairs.append((left[doc][0], right[doc][0]))
    return pairs


def compare_table(a: tuple[str, Path, dict[str, Any]], b: tuple[str, Path, dict[str, Any]],
                  level: float = LEVEL) -> pd.DataFrame:
    """One row per task both summaries scored with the same metric: items, means, B − A, interval, p."""
    (a_name, a_dir, a_tasks), (b_name, b_dir, b_tasks) = a, b
    shared = [t for t in a_tasks if t in b_tasks and a_tasks[t]["metric"] == b_tasks[t]["metric"]]
    rows = []
    for task in shared:
        metric = a_tasks[task]["metric"]
        pairs = paired_scores((a_name, a_dir), (b_name, b_dir), task, metric)
        differences = [y - x for x, y in pairs]
        diff = t_interval(differences, level)
        rows.append({"task": task, "metric": metric, "items": len(pairs),
                     "a": sum(x for x, _ in pairs) / len(pairs), "b": sum(y for _, y in pairs) / len(pairs),
                     "b_minus_a": diff.mean, "ci_low": diff.low, "ci_high": diff.high,
                     "p": paired_t_pvalue(differences), "interval": "paired t over items"})
    return pd.DataFrame(rows)


# measure kept per row by `lrc evaluate` -> its name in the table
HELDOUT_MEASURES = {"nll": "heldout_ce", "kl_to_teacher": "heldout_kl_to_teacher",
                    "top1_agreement": "heldout_top1_agreement"}


def heldout_table(a: tuple[str, dict[str, Any] | None], b: tuple[str, dict[str, Any] | None],
                  level: float = LEVEL) -> pd.DataFrame:
    """One row per held-out measure both evaluations kept per row: per token, B − A over the same rows
    with its paired bootstrap interval and p (none where either kept no rows)."""
    (a_name, a_rows), (b_name, b_rows) = a, b
    if not a_rows or not b_rows:
        return pd.DataFrame()
    if a_rows["tokens"] != b_rows["tokens"]:
        raise LRCError(f"{a_name} and {b_name} were not measured on the same held-out rows (their counted tokens "
                       "per row differ): evaluate both with the same --heldout and --heldout-rows")
    tokens = sum(a_rows["tokens"])
    rows = []
    for measure, name in HELDOUT_MEASURES.items():
        if measure in a_rows and measure in b_rows:
            boot = paired_bootstrap(a_rows[measure], b_rows[measure], a_rows["tokens"], level)
            rows.append({"task": name, "metric": "per token", "items": boot.rows, "a": sum(a_rows[measure]) / tokens,
                         "b": sum(b_rows[measure]) / tokens, "b_minus_a": boot.difference, "ci_low": boot.low,
                         "ci_high": boot.high, "p": boot.p, "interval": "paired bootstrap over held-out rows"})
    return pd.DataFrame(rows)
