"""Hub revisions a config leaves floating: warnings the config check prints before any job.

A teacher or dataset named by a branch (``main``) or by nothing can change between two runs of
the same config, and with it every number downstream; a 40-digit commit hash cannot. Not an
error (a first exploratory run may want the newest data), but said in the dry run, naming the
key and, for a mixture file, the source.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

COMMIT = re.compile(r"[0-9a-f]{40}")
HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")  # owner/name; a local file has a suffix, a built-in source no owner
LOCAL_SUFFIXES = (".jsonl", ".json", ".txt", ".parquet")


def _floating(where: str, what: str, revision: object) -> list[str]:
    if isinstance(revision, str) and COMMIT.fullmatch(revision):
        return []
    given = f"is {revision!r}, a branch or tag" if revision else "is not given (the newest commit)"
    return [f"{where} {given}: {what} can change between two runs of this config; pin a commit hash"]


def _is_hub(source: object, workdir: Path) -> bool:
    return (isinstance(source, str) and bool(HUB_ID.fullmatch(source)) and not source.endswith(LOCAL_SUFFIXES)
            and not (workdir / source).exists())


def _mixture_sources(mixture: str, workdir: Path, repo: Path) -> list[dict]:
    for base in (workdir, repo):
        try:
            sources = (yaml.safe_load((base / mixture).read_text()) or {}).get("sources")
        except (OSError, yaml.YAMLError, AttributeError):
            continue
        return [s for s in sources if isinstance(s, dict)] if isinstance(sources, list) else []
    return []  # a missing or broken mixture file is the config check's to refuse


def floating_revisions(config: dict, workdir: Path | str, repo: Path | str) -> list[str]:
    """One warning per hub teacher or dataset of every experiment not pinned to a commit."""
    workdir, repo, warnings = Path(workdir), Path(repo), []
    for exp, settings in config["experiments"].items():
        teacher = settings.get("teacher") or {}
        if teacher.get("source") == "hub":
            hub = teacher.get("hub") or {}
            warnings += _floating(f"experiments.{exp}.teacher.hub.revision", f"the teacher {hub.get('repo_id')}",
                                  hub.get("revision"))
        for kind, section in (settings.get("data") or {}).items():
            section = section or {}
            if _is_hub(section.get("source"), workdir):
                warnings += _floating(f"experiments.{exp}.data.{kind}.revision", f"the dataset {section['source']}",
                                      section.get("revision"))
            if section.get("mixture"):
                for i, source in enumerate(_mixture_sources(section["mixture"], workdir, repo)):
                    if _is_hub(source.get("source"), workdir):
                        warnings += _floating(f"{section['mixture']}: sources[{i}].revision",
                                              f"the dataset {source['source']}", source.get("revision"))
    return list(dict.fromkeys(warnings))
