"""The checkpoint directory of a training job: ``checkpoints/<output without results/>/<key>``.

``python -m lrc.workflow.ckpt_key OUTPUT PARAM... -- INPUT...`` prints it (the shell helper
``ckpt_dir`` in workflow/scripts/shell_helpers.sh; every training rule passes its output, its
params and its inputs). The key hashes every param (the job's flags and any setting the rule
passes, such as the student width; the wildcards are in OUTPUT) and the *content* of each input:
the SHA-256 of every file in it, by relative path, except the records that differ between two
byte-identical builds (:data:`VOLATILE`: ``settings.json`` with its creation time, git revision
and training speed; ``metrics.jsonl`` with its timings; a merged student's model card ``README.md``,
which names the code; a token directory's ``verified.json`` stamp of mtimes; hidden files such as
Snakemake's ``.snakemake_timestamp``). So a rebuilt input with the same bytes resumes the same
checkpoint, and an input whose bytes changed (another teacher, corpus or warm start: also one that
only another machine or library made different) starts afresh instead of resuming a checkpoint
trained against other inputs.

Hashing reads every input file (about 1 GB/s), once: each file's hash is cached in
``checkpoints/.content-hashes.json`` under its path, size, mtime, ctime and inode, so a later job
re-hashes only files that were rewritten since. Unlike mtime, ctime cannot be set back by hand.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Sequence

VOLATILE = frozenset({"settings.json", "metrics.jsonl", "verified.json", "README.md"})
CACHE_FILE = Path("checkpoints") / ".content-hashes.json"
KEY_LENGTH = 12


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def content_files(root: Path) -> list[tuple[str, Path]]:
    """The files of ``root`` that the key hashes: (relative POSIX path, path), sorted by path."""
    if root.is_file():
        return [(root.name, root)]
    found = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if not name.startswith(".") and name not in VOLATILE:
                path = Path(dirpath) / name
                found.append((path.relative_to(root).as_posix(), path))
    return sorted(found)


class HashCache:
    """SHA-256 of files, remembered by (size, mtime, ctime, inode) in a JSON file shared by the jobs.

    Concurrent jobs each replace the file atomically; an entry lost to another job's write is
    simply computed again.
    """

    def __init__(self, path: Path | None):
        self.path, self.entries, self.changed = path, {}, False
        try:
            loaded = json.loads(path.read_text()) if path is not None else {}
            self.entries = loaded if isinstance(loaded, dict) else {}
        except (OSError, ValueError):
            pass

    def sha256(self, path: Path) -> str:
        key, stamp = os.path.abspath(path), _stamp(path.stat())
        entry = self.entries.get(key)
        if isinstance(entry, list) and len(entry) == 2 and entry[0] == stamp:
            return entry[1]
        digest = _sha256(path)
        if _stamp(path.stat()) == stamp:  # not rewritten while it was read
            self.entries[key], self.changed = [stamp, digest], True
        return digest

    def save(self) -> None:
        if self.path is None or not self.changed:
            return
        live = {k: v for k, v in self.entries.items() if os.path.exists(k)}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex[:8]}.tmp")
            tmp.write_text(json.dumps(live, indent=0, sort_keys=True) + "\n")
            os.replace(tmp, self.path)
        except OSError as err:  # a cache: the key stands without it
            print(f"warning: cannot write the content-hash cache {self.path}: {err}", file=sys.stderr)


def content_digest(root: Path, cache: HashCache | None = None) -> str:
    """One line per content file of ``root`` (``path sha256``); ``missing`` when ``root`` does not exist."""
    if not root.exists():
        return "missing\n"
    cache = cache or HashCache(None)
    return "".join(f"{rel} {cache.sha256(path)}\n" for rel, path in content_files(root))


def checkpoint_key(params: Sequence[str], inputs: Sequence[str | Path], cache: HashCache | None = None) -> str:
    digest = hashlib.sha256()
    for param in params:
        digest.update(f"param {param}\n".encode())
    for i, root in enumerate(inputs):
        digest.update(f"input {i}\n{content_digest(Path(root), cache)}".encode())
    return digest.hexdigest()[:KEY_LENGTH]


def checkpoint_dir(output: str, params: Sequence[str], inputs: Sequence[str | Path],
                   cache_file: Path | None = CACHE_FILE) -> str:
    """``checkpoints/<output without results/>/<key>`` (see the module doc)."""
    cache = HashCache(cache_file)
    key = checkpoint_key(params, inputs, cache)
    cache.save()
    return f"checkpoints/{output.removeprefix('results/')}/{key}"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] == "--":
        print("usage: python -m lrc.workflow.ckpt_key OUTPUT PARAM... -- INPUT...", file=sys.stderr)
        return 2
    output, rest = args[0], args[1:]
    split = rest.index("--") if "--" in rest else len(rest)
    print(checkpoint_dir(output, rest[:split], rest[split + 1:]), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
