"""What a checkpoint records beyond its structure: the content of its files and the code that trained it.

:mod:`lrc.training.checkpoint` checks a checkpoint's structure (names, shapes, files that load);
that misses a flipped bit inside a tensor (one float turned 3e38 loads, merges and evaluates). So
every step directory's ``trainer_state.json`` (written last) also holds:

- ``files``: the SHA-256 of every other file of the step directory (relative paths; under FSDP the
  files of the sharded directories too), hashed when the checkpoint is saved. Verifying a
  checkpoint before it is resumed or reused re-hashes each listed file that should be there (a
  final-only checkpoint: its weights); a mismatch is a :class:`DamagedCheckpoint` naming the file,
  which the checkpoint module sets aside like any other damage (falling back to the previous
  checkpoint, or training afresh). Cost: SHA-256 runs at about 1 GB/s on one core, once per save
  and once per resume, over the trainable weights and the optimiser state (about 3x the trainable
  weights in fp32: some seconds for a student of a billion parameters, small beside its training).
  A checkpoint written before this record existed is used with a warning that it cannot be checked.
- ``trained_by``: the code (:func:`lrc.io.provenance.code_identity`) of each run that trained the
  weights, oldest first: a run resumed across a code change lists both. The DONE marker's summary
  carries the final list, so a rerun that finds the run finished (``--forcerun`` after a code
  change) reports the code that trained the weights, which :func:`lrc.io.provenance.write_settings`
  then records as the output's revision. Reusing weights of other code is allowed, with a warning
  naming both codes and the directory to delete to retrain: a commit that does not touch training
  (an evaluation fix, docs) would otherwise retrain every model, and a resumed multi-hour run would
  be lost to an unrelated edit; what must not happen is that the weights are credited to code that
  did not train them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Iterable

from lrc.io import provenance

TRAINER_STATE_FILE = "trainer_state.json"
FILES = "files"  # trainer-state keys
TRAINED_BY = "trained_by"


class DamagedCheckpoint(Exception):
    """A checkpoint file that is missing, does not parse or changed since it was saved; ``path`` names it."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def hash_files(step_dir: Path, *, skip: Iterable[str]) -> dict[str, str]:
    """SHA-256 of every file under ``step_dir`` but ``skip`` (relative POSIX paths, sorted)."""
    skipped = set(skip)
    found = sorted(p for p in step_dir.rglob("*") if p.is_file())
    return {rel: provenance.sha256_file(p) for p in found if (rel := p.relative_to(step_dir).as_posix()) not in skipped}


def check_files(step_dir: Path, state: dict[str, Any], *, only: Iterable[str] | None = None) -> None:
    """Re-hash the files ``state`` lists (or those of ``only`` it lists); raise on the first that differs."""
    recorded = state.get(FILES)
    if not isinstance(recorded, dict):
        warn(f"checkpoint {step_dir} records no content hashes (an older lrc wrote it): "
             "its files cannot be checked for damage")
        return
    names = sorted(recorded) if only is None else [n for n in only if n in recorded]
    for name in names:
        path = step_dir / name
        if not path.is_file():
            raise DamagedCheckpoint(path, "missing")
        if (actual := provenance.sha256_file(path)) != recorded[name]:
            raise DamagedCheckpoint(path, f"content changed since it was saved (sha256 {actual[:16]}..., "
                                          f"recorded {str(recorded[name])[:16]}...): the checkpoint is damaged")


def trained_by(state: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The code that trained a checkpoint's weights, oldest first (an unrecorded entry if it predates the record)."""
    if state is None:
        return []
    found = state.get(TRAINED_BY)
    return found if isinstance(found, list) else [{"git_revision": None, "note": "not recorded (an older lrc)"}]


def extended(history: list[dict[str, Any]], identity: dict[str, Any]) -> list[dict[str, Any]]:
    """``history`` with ``identity`` appended unless it is the same code as the last entry."""
    return history if history and provenance.same_code(history[-1], identity) else [*history, identity]


def read_state(step_dir: Path | None) -> dict[str, Any] | None:
    try:
        state = json.loads((step_dir / TRAINER_STATE_FILE).read_text()) if step_dir else None
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def record(step_dir: Path, previous: Path | None) -> dict[str, Any]:
    """A new checkpoint's integrity fields: its files' hashes, and the code history carried on from
    ``previous`` (the checkpoint this run resumed from or saved last; None: trained from the start)."""
    history = extended(trained_by(read_state(previous)) if previous else [], provenance.code_identity())
    return {FILES: hash_files(step_dir, skip=[TRAINER_STATE_FILE]), TRAINED_BY: history}


def final_code(step_dir: Path | None) -> list[dict[str, Any]]:
    """``trained_by`` of a finished run's final checkpoint (this code if there is none)."""
    return trained_by(read_state(step_dir)) or [provenance.code_identity()]


def note_other_code(step_dir: Path, state: dict[str, Any], ckpt_dir: Path, *, done: dict[str, Any] | None) -> None:
    """Warn when the checkpoint about to be reused (``done``: the run's DONE marker, at this step)
    or resumed was trained by other code than this."""
    history, now = trained_by(state), provenance.code_identity()
    if all(provenance.same_code(c, now) for c in history):
        return
    then = ", then ".join(provenance.describe_code(c) for c in history)
    if done is not None and done.get("step") == state.get("step"):
        warn(f"checkpoint {step_dir} finished training with other code ({then}); this is "
             f"{provenance.describe_code(now)}. Reusing its weights: settings.json records the code that trained "
             f"them. To train them with this code, delete {ckpt_dir} and run again")
    else:
        warn(f"resuming checkpoint {step_dir}, trained so far by other code ({then}), with "
             f"{provenance.describe_code(now)}: settings.json will list both. To train with this code only, "
             f"delete {ckpt_dir} and run again")
