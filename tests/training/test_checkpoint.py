"""Checkpoint life cycle: two kept, verified on load, a damaged one set aside; one run per directory;
what a finished run keeps (--keep-checkpoints)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lrc.errors import LRCError
from lrc.method.objectives import LMObjective
from lrc.training import checkpoint as ckpt
from lrc.training.loop import TrainArgs, train
from lrc.training.outputs import copy_metrics
from tests.helpers import ENV, SEQ, RandomTokens, tiny_llama

REPO = Path(__file__).resolve().parents[2]
STEPS = 6
# keep_checkpoints="all": these tests stage a kill just before DONE, when both full checkpoints
# still exist (retention runs only after DONE), by removing the DONE of a finished run.
ARGS = dict(tokens=SEQ * 8 * STEPS, batch_size=8, micro_batch_size=4, lr=3e-3, warmup=0.1, log_every=1,
            checkpoint_every=2, progress=False, keep_checkpoints="all")


def run(out: Path, **changes) -> tuple[dict, dict[str, torch.Tensor]]:
    model = tiny_llama()
    summary = train(LMObjective(model), model, RandomTokens(rows=24), TrainArgs(**(ARGS | changes)), out)
    return summary, {n: p.detach().clone() for n, p in model.named_parameters()}


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def garbage(path: Path) -> None:
    path.write_text('{"step": 6, "fingerp')


@pytest.fixture
def finished(tmp_path):
    """An uninterrupted run (its weights), then its DONE marker removed: as if killed just before it."""
    summary, weights = run(tmp_path / "out")
    ckpt_dir = tmp_path / "out.ckpt"
    assert [p.name for p in ckpt.list_checkpoints(ckpt_dir)] == [ckpt.step_dir_name(4), ckpt.step_dir_name(6)]
    (ckpt_dir / ckpt.DONE_FILE).unlink()
    return tmp_path, ckpt_dir, weights


def metric_steps(summary: dict) -> list[int]:
    return [json.loads(x)["step"] for x in Path(summary["metrics"]).read_text().splitlines()]


@pytest.mark.parametrize("name, damage", [
    (ckpt.TRAINABLE_FILE, truncate),
    (ckpt.TRAINER_STATE_FILE, garbage),
    (ckpt.OPTIMIZER_FILE, truncate),
])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(finished, capsys, name, damage):
    tmp_path, ckpt_dir, straight = finished
    bad = ckpt_dir / ckpt.step_dir_name(6) / name
    damage(bad)
    capsys.readouterr()
    summary, weights = run(tmp_path / "out")
    err = capsys.readouterr().err
    assert f"checkpoint {bad.parent} is damaged: {bad} " in err and "falling back to step-000004" in err
    assert summary["resumed_from"] == str(ckpt_dir / ckpt.step_dir_name(4)) and not summary["already_done"]
    assert all(torch.equal(straight[n], weights[n]) for n in straight), (
        "fallback run differs from the uninterrupted one")
    assert metric_steps(summary) == list(range(1, STEPS + 1))
    # The damaged one is set aside (not listed, not deleted); the redone step 6 replaced it.
    assert (ckpt_dir / ("damaged-" + ckpt.step_dir_name(6)) / name).is_file()
    assert [p.name for p in ckpt.list_checkpoints(ckpt_dir)] == [ckpt.step_dir_name(4), ckpt.step_dir_name(6)]
    assert ckpt.read_done(ckpt_dir)["step"] == STEPS


def test_with_no_good_checkpoint_the_run_starts_afresh(finished, capsys):
    tmp_path, ckpt_dir, straight = finished
    truncate(ckpt_dir / ckpt.step_dir_name(6) / ckpt.OPTIMIZER_FILE)
    garbage(ckpt_dir / ckpt.step_dir_name(4) / ckpt.TRAINER_STATE_FILE)
    capsys.readouterr()
    summary, weights = run(tmp_path / "out")
    err = capsys.readouterr().err
    assert str(ckpt_dir / ckpt.step_dir_name(6) / ckpt.OPTIMIZER_FILE) in err
    assert str(ckpt_dir / ckpt.step_dir_name(4) / ckpt.TRAINER_STATE_FILE) in err and "starting afresh" in err
    assert summary["resumed_from"] is None
    assert all(torch.equal(straight[n], weights[n]) for n in straight)
    assert metric_steps(summary) == list(range(1, STEPS + 1))


def test_verify_names_each_missing_or_unreadable_file(finished):
    _, ckpt_dir, _ = finished
    step_dir = ckpt_dir / ckpt.step_dir_name(6)
    expect = dict(trainable={n: tuple(p.shape) for n, p in tiny_llama().named_parameters()}, optimizer_params=None,
                  processes=1)
    ckpt.verify_checkpoint(step_dir, **expect)  # whole: passes
    with pytest.raises(ckpt.DamagedCheckpoint, match="other trainable parameters"):
        ckpt.verify_checkpoint(step_dir, **(expect | {"trainable": {"lm_head.weight": (97, 32)}}))
    n = len(expect["trainable"])
    ckpt.verify_checkpoint(step_dir, **(expect | {"optimizer_params": n}))
    with pytest.raises(ckpt.DamagedCheckpoint, match=f"holds {n} parameters, the optimiser {n + 1}"):
        ckpt.verify_checkpoint(step_dir, **(expect | {"optimizer_params": n + 1}))
    truncate(step_dir / ckpt.RNG_FILE.format(0))
    with pytest.raises(ckpt.DamagedCheckpoint, match=ckpt.RNG_FILE.format(0)) as err:
        ckpt.verify_checkpoint(step_dir, **expect)
    assert err.value.path == step_dir / ckpt.RNG_FILE.format(0)
    (step_dir / ckpt.SCHEDULER_FILE).unlink()
    with pytest.raises(ckpt.DamagedCheckpoint, match=f"{ckpt.SCHEDULER_FILE}: missing"):
        ckpt.verify_checkpoint(step_dir, **expect)


HOLD = """
import sys, time
from lrc.training.checkpoint import CheckpointLock
CheckpointLock(sys.argv[1]).acquire()
print("locked", flush=True)
time.sleep(120)
"""


def test_a_second_run_on_a_locked_checkpoint_directory_is_refused_naming_the_holder(tmp_path):
    ckpt_dir = tmp_path / "out.ckpt"
    partial = ckpt_dir / ".tmp-step-000002"  # what a live run could be writing: the refused run must not touch it
    partial.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(ckpt_dir)], env=ENV | {"PYTHONPATH": str(REPO)},
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked", holder.stderr.read()
        assert (ckpt_dir / ckpt.LOCK_FILE).read_text().strip() == str(holder.pid)
        with pytest.raises(LRCError, match=rf"in use by process {holder.pid} .*stop that process or wait"):
            run(tmp_path / "out")
        assert (partial.is_dir() and ckpt.list_checkpoints(ckpt_dir) == []
                and not Path(ckpt_dir / ckpt.METRICS_FILE).exists())
    finally:
        holder.kill()
        holder.wait()
    # The kernel released the lock of the killed holder: the next run proceeds.
    summary, _ = run(tmp_path / "out")
    assert summary["steps"] == STEPS and not partial.exists()
    assert (ckpt_dir / ckpt.LOCK_FILE).read_text().strip() == str(os.getpid())


def test_the_lock_is_released_when_a_run_ends_or_fails(tmp_path):
    run(tmp_path / "out")
    with ckpt.CheckpointLock(tmp_path / "out.ckpt"):
        with pytest.raises(LRCError, match=f"in use by process {os.getpid()}"):
            ckpt.CheckpointLock(tmp_path / "out.ckpt").acquire()
    model = tiny_llama()
    with pytest.raises(LRCError, match="other settings"):
        train(LMObjective(model), model, RandomTokens(rows=24), TrainArgs(**(ARGS | {"lr": 1e-3})), tmp_path / "out")
    ckpt.CheckpointLock(tmp_path / "out.ckpt").acquire().release()


def test_metrics_are_truncated_to_the_resumed_step_and_copied_once(tmp_path):
    path = tmp_path / "ckpt" / ckpt.METRICS_FILE
    ckpt.truncate_metrics(path, 0)  # no log yet: an empty one
    assert path.read_text() == ""
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)) + '{"step": 4, "lo')
    ckpt.truncate_metrics(path, 2)
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'
    out = tmp_path / "out"
    out.mkdir()
    copy_metrics(path, out)
    assert (out / ckpt.METRICS_FILE).read_text() == path.read_text()
    copy_metrics(tmp_path / "nowhere.jsonl", out)
    assert (out / ckpt.METRICS_FILE).read_text() == ""


def test_the_trainer_state_file_keeps_its_name_on_disk():
    assert ckpt.TRAINER_STATE_FILE == "trainer_state.json" and not hasattr(ckpt, "STATE_FILE")


# ---- retention of a finished run -------------------------------------------------------


def files_of(step_dir: Path) -> set[str]:
    return {p.name for p in step_dir.iterdir()}


def test_a_finished_run_keeps_only_its_final_weights_and_a_rerun_reuses_them(tmp_path):
    _, straight = run(tmp_path / "out", keep_checkpoints="final")
    ckpt_dir = tmp_path / "out.ckpt"
    assert [p.name for p in ckpt.list_checkpoints(ckpt_dir)] == [ckpt.step_dir_name(STEPS)]
    final = ckpt_dir / ckpt.step_dir_name(STEPS)
    assert files_of(final) == {ckpt.TRAINER_STATE_FILE, ckpt.TRAINABLE_FILE}  # no optimiser, scheduler, RNG
    assert ckpt.is_final_only(final) and ckpt.read_done(ckpt_dir)["step"] == STEPS
    assert TrainArgs().keep_checkpoints == "final"  # the default
    # A rerun (its output lost) finds the job done and rebuilds the final weights from them.
    again, weights = run(tmp_path / "out", keep_checkpoints="final")
    assert again["already_done"] and again["resumed_from"] == str(final)
    assert all(torch.equal(straight[n], weights[n]) for n in straight)
    # Without DONE (say, damaged) the final-only step is still the end: nothing is trained on it.
    (ckpt_dir / ckpt.DONE_FILE).unlink()
    third, weights = run(tmp_path / "out", keep_checkpoints="final")
    assert (not third["already_done"] and third["resumed_from"] == str(final)
            and ckpt.read_done(ckpt_dir)["step"] == STEPS)
    assert all(torch.equal(straight[n], weights[n]) for n in straight)


def test_keep_all_leaves_two_full_checkpoints_and_none_leaves_none(tmp_path):
    run(tmp_path / "all", keep_checkpoints="all")
    kept = ckpt.list_checkpoints(tmp_path / "all.ckpt")
    assert [p.name for p in kept] == [ckpt.step_dir_name(4), ckpt.step_dir_name(6)]
    assert all({ckpt.OPTIMIZER_FILE, ckpt.SCHEDULER_FILE, ckpt.TRAINABLE_FILE} <= files_of(p) for p in kept)
    assert not any(ckpt.is_final_only(p) for p in kept)
    _, straight = run(tmp_path / "none", keep_checkpoints="none")
    assert ckpt.list_checkpoints(tmp_path / "none.ckpt") == [] and ckpt.read_done(tmp_path / "none.ckpt") is not None
    again, weights = run(tmp_path / "none", keep_checkpoints="none")  # nothing to reuse: trained again, the same
    assert not again["already_done"] and again["resumed_from"] is None
    assert metric_steps(again) == list(range(1, STEPS + 1))
    assert all(torch.equal(straight[n], weights[n]) for n in straight)
    with pytest.raises(LRCError, match="--keep-checkpoints"):
        TrainArgs(keep_checkpoints="some")


def test_a_kill_while_stripping_leaves_a_checkpoint_that_verifies(tmp_path, capsys):
    _, straight = run(tmp_path / "out")  # keep all, then strip by hand up to a kill
    ckpt_dir = tmp_path / "out.ckpt"
    final = ckpt_dir / ckpt.step_dir_name(STEPS)
    state = ckpt.read_state(final)
    (final / ckpt.TRAINER_STATE_FILE).write_text(json.dumps(state | {ckpt.FINAL_ONLY: True}))  # marked ...
    (final / ckpt.OPTIMIZER_FILE).unlink()  # ... and killed after the first file went
    again, weights = run(tmp_path / "out", keep_checkpoints="final")
    assert again["already_done"] and all(torch.equal(straight[n], weights[n]) for n in straight)
    assert files_of(final) == {ckpt.TRAINER_STATE_FILE, ckpt.TRAINABLE_FILE}  # the rerun finished the stripping
    # A final-only checkpoint whose weights are damaged is set aside like any other: retrained.
    truncate(final / ckpt.TRAINABLE_FILE)
    capsys.readouterr()
    third, weights = run(tmp_path / "out", keep_checkpoints="final")
    assert "is damaged" in capsys.readouterr().err and not third["already_done"]
    assert all(torch.equal(straight[n], weights[n]) for n in straight)
