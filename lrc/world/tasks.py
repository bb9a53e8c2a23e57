"""The tiny world's local lm-eval tasks: data files and task YAMLs.

The suite itself (families, metric per task) is data in ``lrc/io/suites/tiny.yaml``; the
lm-eval task YAML is the template ``lrc/io/suites/tiny_task.yaml``; both are read through
:mod:`lrc.io.suites`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import yaml

from lrc.io.suites import load_suite, task_template
from lrc.world.generator import TEMPLATES, Person, World


def cloze(template: str, person: Person) -> str:
    """The template's words before the value, with the person's name filled in."""
    return template.split(" {v}")[0].format(n=person.name)


def task_documents(world: World, spec: dict[str, Any], count: int, rng: random.Random) -> list[dict[str, Any]]:
    """``count`` seeded (person, fact) questions of one family (0: every one, in seeded order),
    with shuffled distractors."""
    pairs = [(p, f) for p in world.people for f in spec["facts"]]
    pairs = rng.sample(pairs, min(count, len(pairs)) if count else len(pairs))
    docs = []
    for person, fact in pairs:
        if spec["template"] == "heldout":
            template = TEMPLATES[fact][person.heldout[fact]]
        else:
            template = rng.choice(world.seen_templates(person, fact))
        right = person.facts[fact]
        wrong = [v for v in world.values[fact] if v not in (right, person.name)]
        options = [right] + rng.sample(wrong, spec["choices"] - 1)
        rng.shuffle(options)
        docs.append({
            "context": cloze(template, person),
            "choices": [" " + v for v in options],
            "gold": options.index(right),
            "person": person.name,
            "fact": fact,
        })
    return docs


def write_tasks(world: World, out_dir: Path, eval_docs: int, rng: random.Random) -> dict[str, dict[str, Any]]:
    """Write ``<task>.jsonl`` and ``<task>.yaml`` for every family; returns name -> info."""
    suite = load_suite("tiny")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, spec in suite["tasks"].items():
        docs = task_documents(world, spec, eval_docs, rng)
        data = out_dir / f"{name}.jsonl"
        data.write_text("".join(json.dumps(d, sort_keys=True) + "\n" for d in docs))
        config = task_template()
        config["task"] = name
        # The world directory's own absolute path, so lm-eval run by hand finds the data;
        # `lrc evaluate` re-points it at run time, so moving the directory is fine too.
        config["dataset_kwargs"]["data_files"]["test"] = str(data.resolve())
        (out_dir / f"{name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        written[name] = {"docs": len(docs), "metric": spec["metric"], "chance": 1.0 / spec["choices"]}
    return written
