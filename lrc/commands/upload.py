"""`lrc upload`: a merged student to the Hugging Face hub (through ``huggingface_hub``).

Checked before any network call: the directory is a merged student whose merge check passed and
which carries its model card (`lrc merge` writes both). ``settings.json`` stays behind (it records
this machine's paths and host name); the card, the weights, the config, the tokenizer, the merge
check and the teacher's licence files go. The repository is created private unless told otherwise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from lrc.errors import LRCError
from lrc.io.model_card import CARD_FILE, MERGE_CHECK
from lrc.options import OUTPUT_MARKER, parse_args

LEFT_BEHIND = ("settings.json", OUTPUT_MARKER)


@dataclass(kw_only=True)
class UploadArgs:
    """Upload a merged student (weights, config, tokenizer, model card, licence files) to the hub."""

    model: Path = field(metadata={"help": "merged student directory (results/{exp}/merged/<run>)", "positional": True})
    repo_id: str = field(metadata={"help": "hub repository, owner/name (created if absent)"})
    private: bool = field(default=True, metadata={"help": "create the repository private"})
    revision: str | None = field(default=None, metadata={"help": "branch to commit to (default: main)"})
    commit_message: str | None = field(default=None, metadata={"help": "commit message (default: names the run)"})


def files_to_upload(model: Path) -> list[str]:
    """The files that go, after the checks that must pass first (else an LRCError naming the file)."""
    if not model.is_dir():
        raise LRCError(f"{model}: not a directory (a merged student from `lrc merge`)")
    names = sorted(p.name for p in model.iterdir() if p.is_file())
    for needed in ("config.json", CARD_FILE, MERGE_CHECK):
        if needed not in names:
            raise LRCError(f"{model}: no {needed}; upload a merged student as `lrc merge` writes it "
                           "(weights, config, model card, merge check)")
    if not any(n.endswith(".safetensors") for n in names):
        raise LRCError(f"{model}: no safetensors weights")
    check = json.loads((model / MERGE_CHECK).read_text())
    if not check.get("passed") or not (check.get("generation") or {}).get("passed", True):
        raise LRCError(f"{model}/{MERGE_CHECK}: the merge check did not pass; this student is not uploaded")
    return [n for n in names if n not in LEFT_BEHIND]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(UploadArgs, argv, prog="lrc upload")
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HFValidationError, OfflineModeIsEnabled
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(args.repo_id)
    except HFValidationError as err:
        raise LRCError(f"--repo-id {args.repo_id!r}: {err}") from err
    files = files_to_upload(args.model)
    if not any(n.upper().startswith(("LICENSE", "LICENCE")) for n in files):
        print(f"warning: {args.model} holds no licence file of the teacher; its model card says what to look up")
    api = HfApi()
    try:
        api.create_repo(args.repo_id, private=args.private, exist_ok=True)
        info = api.upload_folder(repo_id=args.repo_id, folder_path=args.model, revision=args.revision,
                                 allow_patterns=files,
                                 commit_message=args.commit_message or f"lrc: the merged student {args.model.name}")
    except OfflineModeIsEnabled as err:
        raise LRCError(f"cannot upload to {args.repo_id}: the hub is switched off here (HF_HUB_OFFLINE=1)") from err
    print(f"uploaded {len(files)} files of {args.model} to {info.commit_url}")
    return 0
