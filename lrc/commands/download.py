"""`lrc download`: a teacher from the Hugging Face hub at a pinned revision (:mod:`lrc.io.hub`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from lrc.io.hub import copy_teacher_files, fetch_snapshot
from lrc.io.provenance import sha256_file, write_settings
from lrc.options import parse_args


@dataclass(kw_only=True)
class DownloadArgs:
    """Download a teacher (safetensors, config, tokenizer) from the Hugging Face hub at a pinned revision."""

    repo_id: str = field(metadata={"help": "hub model id, e.g. meta-llama/Llama-3.2-3B"})
    revision: str = field(metadata={"help": "commit hash (or tag) to pin; recorded in settings.json"})
    out: Path = field(metadata={"help": "output directory (a plain HF checkpoint)", "output": "dir"})
    cache_dir: Path | None = field(default=None, metadata={"help": "hub cache directory (default: the hub's own)"})
    link: bool = field(default=True, metadata={
        "help": "link the weight files to the hub cache instead of copying them (their SHA-256 recorded; a "
                "cleaned cache then breaks the teacher: --no-link copies)"})


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(DownloadArgs, argv, prog="lrc download")
    snapshot = fetch_snapshot(args.repo_id, args.revision, args.cache_dir)

    def record(tmp: Path, keep: list[str]) -> None:
        weights = {n: sha256_file(tmp / n) for n in keep if n.endswith(".safetensors")}
        # The snapshot folder is named by the commit the revision resolved to.
        write_settings(tmp, "download", args, commit=snapshot.name, files=keep, weights_sha256=weights,
                       linked=sorted(weights) if args.link else [])

    files = copy_teacher_files(snapshot, Path(args.out), repo_id=args.repo_id, revision=args.revision,
                               before_commit=record, link=args.link)
    print(f"{args.out}: {args.repo_id}@{snapshot.name}, {len(files)} files")
    return 0
