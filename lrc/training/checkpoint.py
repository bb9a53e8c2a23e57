"""The checkpoint life cycle of the training loop: lock, save, verify, load, prune, done, metrics.

Layout of a checkpoint directory (``TrainArgs.ckpt_dir``)::

    LOCK                   held (fcntl.flock) by the run's main process; holds its pid
    step-000040/           one accelerate state (optimiser, scheduler, RNG per process)
        trainable.safetensors   the trainable parameters only (frozen teacher weights are
                                rebuilt by the command, so they are not copied into every checkpoint)
        trainer_state.json      step, data position, run fingerprint, the SHA-256 of every other file
                                and the code that trained the weights (:mod:`lrc.training.integrity`);
                                written last
    step-000080/           the newest; the two newest are kept while the run trains
    metrics.jsonl          the live metrics log (each command copies it into its output)
    DONE                   JSON marker: the run finished; its final state is the newest step-*

Decisions, and why:

- **Atomic step directories.** Written as ``.tmp-step-000040``, renamed when complete: a kill or a
  full disk (an error naming the directory) leaves at most a ``.tmp-*`` that the next run removes.
- **Two kept, each verified before use.** A file can still be damaged after the rename (a
  full disk, a copy, a bad sector). Before resuming, the newest checkpoint's files are
  checked: the trainer state parses, ``trainable.safetensors`` holds exactly the model's
  trainable names and shapes, ``optimizer.bin`` and ``scheduler.bin`` load (memory-mapped:
  the zip directory and pickle are read, the tensors are not) and match the optimiser's parameter
  count, and the RNG files that exist load; then every file is re-hashed against the SHA-256
  recorded when it was saved (a flipped bit in a weight passes every structural check; the cost:
  :mod:`lrc.training.integrity`). A damaged one is set aside as ``damaged-step-*`` (kept for
  inspection, never listed) with a warning naming the file, and the previous one is tried;
  with none left the run starts afresh, with a warning. Since the data order is a function
  of the step, falling back costs only the steps redone, never exactness.
- **One run per directory.** The main process holds an exclusive ``flock`` on ``LOCK`` for
  the whole run; a second run (for example, a rerun while an orphaned ``lrc distill`` of a
  killed Snakemake still trains) is refused with an ``LRCError`` naming the holder's pid.
  The kernel drops the lock when the holder dies, so a kill never leaves a stale lock.
- **Retention once finished** (``--keep-checkpoints``, :func:`retain_finished`). No later
  stage reads a checkpoint directory: merge reads the LRC state directory distill writes,
  sft the merged checkpoint, distill the warm start's state directory; each command writes
  its output from the model ``train`` returns. What a finished run's directory still
  serves is a rerun of the same job whose output was lost (e.g. the command died writing
  it): it finds DONE and rewrites the output from the final weights, training nothing. So
  ``final`` (the default) keeps exactly that: the final step's ``trainer_state.json`` and
  ``trainable.safetensors`` (marked ``"final_only": true`` in the state, written *before*
  anything is deleted, so a kill midway leaves a checkpoint that still verifies), plus DONE
  and metrics; the optimiser, scheduler, RNG files and the older checkpoint go (at r = 288
  on SmolLM2-135M: ~400 MB of Adam state per arm). ``all`` keeps the two newest full
  checkpoints, ``none`` no step directory (a rerun trains again, to the same weights).
  Under FSDP the model is a sharded directory that only accelerate's ``load_state``
  restores, so ``final`` keeps the whole final checkpoint there (the older one goes). A
  final-only checkpoint is never trained on: the run fingerprint fixes the step count, so it
  is only ever resumed as the final step. Retention runs after DONE (and again on a rerun
  that finds the run done): a kill before DONE leaves the two full checkpoints.
- **Metrics stay here.** ``metrics.jsonl`` is appended here and truncated to the resumed step;
  each command copies it once into its own atomic output directory (:func:`copy_metrics`).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from accelerate.utils.other import load as accelerate_load
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from lrc.errors import LRCError
from lrc.io.atomic import disk_errors_named, write_json_atomic, write_text_atomic
from lrc.io.hf import trainable_parameters
from lrc.training import integrity
from lrc.training.integrity import TRAINER_STATE_FILE, DamagedCheckpoint, warn  # (their old home is here)

TRAINABLE_FILE = "trainable.safetensors"
OPTIMIZER_FILE = "optimizer.bin"  # accelerate's names
SCHEDULER_FILE = "scheduler.bin"
RNG_FILE = "random_states_{}.pkl"
SHARDED_MODEL_DIR = "pytorch_model_fsdp_0"  # accelerate's names under FSDP (SHARDED_STATE_DICT)
SHARDED_OPTIMIZER_DIR = "optimizer_0"
DONE_FILE = "DONE"
METRICS_FILE = "metrics.jsonl"
LOCK_FILE = "LOCK"
KEEP = 2  # checkpoints kept: the newest, and one to fall back to if it is damaged
DAMAGED_PREFIX = "damaged-"
RETENTIONS = ("final", "all", "none")  # what a finished run keeps (see the module doc)
FINAL_ONLY = "final_only"  # trainer-state key of a checkpoint stripped to its final weights


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def _step_of(path: Path) -> int | None:
    try:
        return int(path.name.split("-")[1])
    except (IndexError, ValueError):
        return None


def list_checkpoints(ckpt_dir: str | Path) -> list[Path]:
    """Step directories (renamed, so complete when written), oldest first."""
    root = Path(ckpt_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.glob("step-*") if p.is_dir() and _step_of(p) is not None]
    return sorted(found, key=_step_of)


def latest_checkpoint(ckpt_dir: str | Path) -> Path | None:
    found = list_checkpoints(ckpt_dir)
    return found[-1] if found else None


def read_state(step_dir: Path) -> dict[str, Any]:
    return json.loads((step_dir / TRAINER_STATE_FILE).read_text())


def remove_partial(ckpt_dir: str | Path) -> None:
    """Delete the remains of checkpoints that were being written when a job died."""
    for p in Path(ckpt_dir).glob(".tmp-*"):
        shutil.rmtree(p, ignore_errors=True)


def prune(ckpt_dir: str | Path, keep: int = KEEP) -> None:
    """Keep only the newest ``keep`` checkpoints."""
    for p in list_checkpoints(ckpt_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(p, ignore_errors=True)


def is_final_only(step_dir: Path) -> bool:
    try:
        return bool(read_state(step_dir).get(FINAL_ONLY))
    except (OSError, ValueError, AttributeError):
        return False


def retain_finished(ckpt_dir: str | Path, retention: str, *, sharded: bool = False) -> None:
    """After DONE: keep what :data:`RETENTIONS` names (main process; see the module doc)."""
    found = list_checkpoints(ckpt_dir)
    if retention == "all" or (retention == "final" and sharded):
        prune(ckpt_dir, KEEP if retention == "all" else 1)
        return
    keep = found[-1:] if retention == "final" else []
    for p in found[:-1] if keep else found:
        shutil.rmtree(p, ignore_errors=True)
    for step_dir in keep:
        # Marked first, then stripped: a kill in between leaves a checkpoint that verifies.
        write_json_atomic(step_dir / TRAINER_STATE_FILE, read_state(step_dir) | {FINAL_ONLY: True})
        for item in step_dir.iterdir():
            if item.name in (TRAINER_STATE_FILE, TRAINABLE_FILE):
                continue
            if item.is_dir():
                shutil.rmtree(item)
            else:
                item.unlink()


def read_done(ckpt_dir: str | Path) -> dict[str, Any] | None:
    """The DONE marker, or None (also when unreadable: the run is then simply not done)."""
    path = Path(ckpt_dir) / DONE_FILE
    try:
        done = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return done if isinstance(done, dict) and "step" in done and "summary" in done else None


def write_done(ckpt_dir: str | Path, step: int, summary: dict[str, Any]) -> None:
    """Mark the run finished. Sets ``summary["trained_by"]`` (the loop returns it) to the final
    checkpoint's code history, which DONE keeps for a rerun that reuses the weights."""
    summary[integrity.TRAINED_BY] = integrity.final_code(latest_checkpoint(ckpt_dir))
    write_json_atomic(Path(ckpt_dir) / DONE_FILE, {"step": step, "summary": summary})


# ---- the lock -----------------------------------------------------------------------------


class CheckpointLock:
    """An exclusive ``flock`` on ``<ckpt_dir>/LOCK``, holding the owner's pid (see module doc)."""

    def __init__(self, ckpt_dir: str | Path):
        self.path = Path(ckpt_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> CheckpointLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise LRCError(
                f"checkpoint directory {self.path.parent} is in use by process {holder} (it holds {self.path}); "
                "another run of this job is still training: stop that process or wait for it"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> CheckpointLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def lock_run(accelerator, ckpt_dir: Path) -> CheckpointLock | None:
    """The main process locks ``ckpt_dir`` for the run; every process raises alike if it cannot."""
    held, error = None, None
    if accelerator.is_main_process:
        try:
            held = CheckpointLock(ckpt_dir).acquire()
        except LRCError as err:
            error = err
        except OSError as err:  # e.g. a read-only directory: still raised on every process alike
            error = LRCError(f"cannot lock the checkpoint directory {ckpt_dir}: {err}")
    failed = accelerator.gather(torch.tensor([int(error is not None)], device=accelerator.device))
    if int(failed.sum()):
        raise error or LRCError(f"the main process could not lock the checkpoint directory {ckpt_dir}")
    return held


# ---- save ---------------------------------------------------------------------------------


def save_checkpoint(accelerator, bare: torch.nn.Module, ckpt_dir: Path, step: int, fingerprint: dict,
                    fsdp: bool) -> None:
    """Write ``step-<step>`` atomically (every process takes part), then prune to :data:`KEEP`."""
    final = ckpt_dir / step_dir_name(step)
    tmp = ckpt_dir / (".tmp-" + final.name)
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()  # every process writes its RNG state into tmp
    with disk_errors_named(tmp):  # a full disk: an error naming tmp, not torch's "enforce fail"
        accelerator.save_state(str(tmp))
        accelerator.wait_for_everyone()  # ... and has finished before tmp is renamed
        if accelerator.is_main_process and not fsdp:
            tensors = {n: p.detach().to("cpu").contiguous() for n, p in trainable_parameters(bare)}
            save_file(tensors, str(tmp / TRAINABLE_FILE))
    if accelerator.is_main_process:
        before = [p for p in list_checkpoints(ckpt_dir) if _step_of(p) < step]  # resumed from, or saved last
        write_json_atomic(tmp / TRAINER_STATE_FILE, {"step": step, "data_position": step, "fingerprint": fingerprint}
                          | integrity.record(tmp, before[-1] if before else None))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        prune(ckpt_dir)
    accelerator.wait_for_everyone()


# ---- verify and load ----------------------------------------------------------------------


def _check_state(step_dir: Path) -> dict[str, Any]:
    path = step_dir / TRAINER_STATE_FILE
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise DamagedCheckpoint(path, f"unreadable ({err})") from err
    if not (isinstance(state, dict) and isinstance(state.get("step"), int)
            and isinstance(state.get("fingerprint"), dict)):
        raise DamagedCheckpoint(path, "not a trainer state (step, fingerprint)")
    if state["step"] != _step_of(step_dir):
        raise DamagedCheckpoint(path, f"says step {state['step']}, the directory {step_dir.name}")
    return state


def _check_trainable(path: Path, expected: dict[str, tuple[int, ...]]) -> None:
    try:
        with safe_open(str(path), "pt") as fh:
            shapes = {name: tuple(fh.get_slice(name).get_shape()) for name in fh.keys()}
    except Exception as err:  # safetensors raises its own error type, OSError when missing
        raise DamagedCheckpoint(path, f"unreadable ({err})") from err
    if set(shapes) != set(expected):
        missing, extra = sorted(set(expected) - set(shapes)), sorted(set(shapes) - set(expected))
        raise DamagedCheckpoint(path, f"other trainable parameters (missing {missing[:3]}, unexpected {extra[:3]})")
    wrong = [n for n in expected if shapes[n] != tuple(expected[n])]
    if wrong:
        raise DamagedCheckpoint(path, f"{wrong[0]} has shape {shapes[wrong[0]]}, the model {tuple(expected[wrong[0]])}")


def _check_torch_file(path: Path) -> Any:
    if not path.is_file():
        raise DamagedCheckpoint(path, "missing")
    try:  # accelerate's own loader, memory-mapped: the structure is read, the tensors are not
        return accelerate_load(str(path), map_location="cpu", mmap=True)
    except Exception as err:  # torch raises RuntimeError/EOFError/UnpicklingError alike
        raise DamagedCheckpoint(path,
                                f"does not load ({type(err).__name__}: {str(err).splitlines()[0][:200]})") from err


def _check_sharded_dir(path: Path) -> None:
    """A torch.distributed.checkpoint directory (FSDP): its ``.metadata`` loads, its files exist."""
    from torch.distributed.checkpoint import FileSystemReader

    try:
        meta = FileSystemReader(str(path)).read_metadata()
    except Exception as err:  # missing directory or file, truncated pickle
        raise DamagedCheckpoint(
            path / ".metadata",
            f"unreadable ({type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''})") from err
    for item in (meta.storage_data or {}).values():
        rel = getattr(item, "relative_path", None)
        if rel and not (path / rel).is_file():
            raise DamagedCheckpoint(path / rel, "missing")


def verify_checkpoint(step_dir: Path, *, trainable: dict[str, tuple[int, ...]] | None, optimizer_params: int | None,
                      processes: int, sharded: bool = False) -> None:
    """Raise :class:`DamagedCheckpoint` naming the first bad file of ``step_dir``.

    ``trainable`` (names -> shapes) and ``optimizer_params`` are None under FSDP (``sharded``),
    whose model and optimiser state accelerate writes as torch.distributed.checkpoint
    directories (``SHARDED_MODEL_DIR``, ``SHARDED_OPTIMIZER_DIR``): their metadata is checked.
    A final-only checkpoint (:func:`retain_finished`) has its state and trainable weights only.
    """
    if (state := _check_state(step_dir)).get(FINAL_ONLY):
        if sharded or trainable is None:
            raise DamagedCheckpoint(step_dir / TRAINER_STATE_FILE,
                                    "final weights only, which a sharded (FSDP) run cannot load")
        _check_trainable(step_dir / TRAINABLE_FILE, trainable)
        integrity.check_files(step_dir, state, only=[TRAINABLE_FILE])
        return
    if sharded:
        for name in (SHARDED_MODEL_DIR, SHARDED_OPTIMIZER_DIR):
            if (step_dir / name).is_dir():  # (FULL_STATE_DICT writes single files instead)
                _check_sharded_dir(step_dir / name)
    if trainable is not None:
        _check_trainable(step_dir / TRAINABLE_FILE, trainable)
    if optimizer_params is not None:
        saved = _check_torch_file(step_dir / OPTIMIZER_FILE)
        try:
            count = sum(len(g["params"]) for g in saved["param_groups"])
        except (TypeError, KeyError) as err:
            raise DamagedCheckpoint(step_dir / OPTIMIZER_FILE, "not an optimiser state") from err
        if count != optimizer_params:
            raise DamagedCheckpoint(step_dir / OPTIMIZER_FILE,
                                    f"holds {count} parameters, the optimiser {optimizer_params}")
    _check_torch_file(step_dir / SCHEDULER_FILE)
    for p in range(processes):  # a missing RNG file (another process count) is accelerate's to skip
        if (step_dir / RNG_FILE.format(p)).exists():
            _check_torch_file(step_dir / RNG_FILE.format(p))
    integrity.check_files(step_dir, state)  # last: the checks above name a truncated file more plainly


def set_aside_damaged(ckpt_dir: Path, **expect) -> Path | None:
    """Verify checkpoints newest first; set damaged ones aside; return the newest good one.

    Main process only, under the lock. ``expect`` goes to :func:`verify_checkpoint`.
    """
    found = list_checkpoints(ckpt_dir)
    for step_dir in reversed(found):
        try:
            verify_checkpoint(step_dir, **expect)
            return step_dir
        except DamagedCheckpoint as bad:
            aside = step_dir.with_name(DAMAGED_PREFIX + step_dir.name)
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(step_dir, aside)
            rest = [p for p in found if _step_of(p) < _step_of(step_dir)]
            then = f"falling back to {rest[-1].name}" if rest else "no earlier checkpoint: starting afresh"
            warn(f"checkpoint {step_dir} is damaged: {bad.path} {bad.reason}; set aside as {aside.name}; {then}")
    return None


def load_trainable(bare: torch.nn.Module, path: Path) -> None:
    """Copy the saved trainable parameters into ``bare`` (names and shapes checked)."""
    saved = load_file(str(path))
    params = dict(trainable_parameters(bare))
    if set(saved) != set(params):
        missing, extra = sorted(set(params) - set(saved)), sorted(set(saved) - set(params))
        raise LRCError(f"checkpoint {path} does not match the model's trainable parameters (missing {missing[:3]}, "
                       f"unexpected {extra[:3]})")
    with torch.no_grad():
        for name, p in params.items():
            if saved[name].shape != p.shape:
                raise LRCError(f"checkpoint {path}: {name} has shape {tuple(saved[name].shape)}, "
                               f"the model {tuple(p.shape)}")
            p.copy_(saved[name])


def load_latest(accelerator, bare: torch.nn.Module, optimizer, ckpt_dir: Path, fingerprint: dict,
                fsdp: bool) -> Path | None:
    """Restore the newest good checkpoint into the prepared objects; return it (None: none).

    The main process removes partial writes and sets damaged checkpoints aside; then every
    process loads what is left. A checkpoint made with other settings is refused; one
    trained by other code is used with a warning (:func:`lrc.training.integrity.note_other_code`).
    """
    if accelerator.is_main_process:
        remove_partial(ckpt_dir)
        set_aside_damaged(
            ckpt_dir, processes=accelerator.num_processes, sharded=fsdp,
            trainable=None if fsdp else {n: tuple(p.shape) for n, p in trainable_parameters(bare)},
            optimizer_params=None if fsdp else sum(len(g["params"]) for g in optimizer.param_groups),
        )
    accelerator.wait_for_everyone()  # the others now list only what the main process verified
    latest = latest_checkpoint(ckpt_dir)
    if latest is None:
        return None
    saved = read_state(latest)["fingerprint"]
    if saved != fingerprint:
        changed = sorted(k for k in fingerprint if saved.get(k) != fingerprint[k])
        raise LRCError(
            f"checkpoint {latest} was made with other settings ({', '.join(changed)} differ); "
            f"delete {ckpt_dir} to start afresh or use another --ckpt-dir"
        )
    if accelerator.is_main_process:
        integrity.note_other_code(latest, read_state(latest), ckpt_dir, done=read_done(ckpt_dir))
    try:
        if not is_final_only(latest):  # (a final-only one has no optimiser state; it is not trained on)
            accelerator.load_state(str(latest))
    except Exception as err:  # verified above, so this is damage the checks cannot see
        raise LRCError(f"checkpoint {latest} does not load ({err}); "
                       "delete it to fall back to the previous one") from err
    if not fsdp:
        load_trainable(bare, latest / TRAINABLE_FILE)
    return latest


# ---- metrics ------------------------------------------------------------------------------


def truncate_metrics(path: Path, upto_step: int) -> None:
    """Drop log lines written after the checkpoint we resume from (they will be redone).

    Leaves an (empty) file in any case, so the path :func:`lrc.training.loop.train` returns exists.
    """
    keep = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                if json.loads(line)["step"] <= upto_step:
                    keep.append(line)
            except (ValueError, KeyError, TypeError):
                pass  # a line torn by the kill
    write_text_atomic(path, "".join(line + "\n" for line in keep))


