"""`lrc download`: a hub teacher at a pinned revision, safetensors only.

``huggingface_hub.snapshot_download`` fetches into the hub's own cache (so repeated runs
and offline runs with ``HF_HUB_OFFLINE=1`` reuse it); the output directory then gets the
weights as symbolic links to the cache's files (no second copy of a multi-GB teacher; their
SHA-256 recorded) and copies of the config and tokenizer files, atomically; ``link=False``
copies the weights too. Pickled weights (``.bin``, ``.pt``, ...) are never fetched nor copied.
"""

from __future__ import annotations

import fnmatch
import json
import shutil
from pathlib import Path

from lrc.errors import LRCError
from lrc.io.atomic import atomic_dir

# What a teacher needs: weights (safetensors and their index), configs, tokenizer files.
ALLOW_PATTERNS = [
    "*.safetensors",
    "*.safetensors.index.json",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
]
# Never, even if a pattern above would match: pickles and framework-specific copies.
IGNORE_PATTERNS = ["*.bin", "*.pt", "*.pth", "*.pkl", "*.ckpt", "*.h5", "*.msgpack", "original/*"]


def wanted(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    if any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(name, p) for p in IGNORE_PATTERNS):
        return False
    return "/" not in path and any(fnmatch.fnmatch(name, p) for p in ALLOW_PATTERNS)


def fetch_snapshot(repo_id: str, revision: str, cache_dir: Path | None = None) -> Path:
    """The snapshot folder of ``repo_id`` at ``revision`` in the hub cache (downloaded if needed)."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=cache_dir,
                                      allow_patterns=ALLOW_PATTERNS, ignore_patterns=IGNORE_PATTERNS))
    except Exception as err:  # offline, unknown repo/revision, gated, network: all named the same way
        raise LRCError(f"cannot download {repo_id!r} at revision {revision!r} from the hub "
                       f"({type(err).__name__}: {err}). Without network, pre-populate the hub cache "
                       "and set HF_HUB_OFFLINE=1.") from err


def place_teacher_files(source: Path, names: list[str], into: Path, *, link: bool) -> list[str]:
    """Put the teacher files ``names`` of ``source`` into ``into``: the weights (``*.safetensors``) as
    symbolic links to the files behind them when ``link``, everything else copied. Returns the linked names."""
    linked = [n for n in names if link and n.endswith(".safetensors")]
    for name in names:
        if name in linked:
            (into / name).symlink_to((source / name).resolve())  # the file itself (a hub cache's blob)
        else:
            shutil.copyfile(source / name, into / name)  # follows a cache's symlinks
    return linked


def copy_teacher_files(snapshot: Path, out: Path, *, repo_id: str, revision: str, before_commit=None,
                       link: bool = False) -> list[str]:
    """Copy the wanted files of a snapshot into ``out`` atomically (``link``: the weights as symbolic
    links to the cache's files); returns their names.

    ``before_commit(tmp_dir, files)`` may add files (settings) before the rename."""
    files = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())
    keep = [f for f in files if wanted(f)]
    if not any(f.endswith(".safetensors") for f in keep):
        raise LRCError(f"{repo_id!r} at revision {revision!r} has no safetensors weights "
                       f"(files: {files}); pickled weights are refused")
    if "config.json" not in keep:
        raise LRCError(f"{repo_id!r} at revision {revision!r} has no config.json")
    try:
        json.loads((snapshot / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise LRCError(f"{repo_id!r}: unreadable config.json ({err})") from err
    with atomic_dir(out) as tmp:
        place_teacher_files(snapshot, keep, tmp, link=link)
        if before_commit is not None:
            before_commit(tmp, keep)
    return keep


