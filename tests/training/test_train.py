"""The training loop: schedules, data order, zero-token runs, metrics, guards, resume refusal."""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

import pytest
import torch

from lrc.errors import LRCError
from lrc.method.objectives import KDObjective, LMObjective, masked_ce
from lrc.training import checkpoint as ckpt
from lrc.training.loop import StepBatches, TrainArgs, lr_factor, train
from tests.helpers import SEQ, VOCAB, RandomTokens, tiny_llama


def quiet(**kw) -> TrainArgs:
    return TrainArgs(progress=False, **kw)


def test_schedules_warm_up_then_decay():
    steps, warm = 100, 10
    assert [lr_factor(s, steps, warm, "linear") for s in (0, 4, 9)] == [0.1, 0.5, 1.0]
    assert lr_factor(10, steps, warm, "linear") == 1.0 and lr_factor(99, steps, warm, "linear") == pytest.approx(1 / 90)
    assert lr_factor(10, steps, warm, "cosine") == 1.0
    assert lr_factor(55, steps, warm, "cosine") == pytest.approx(0.5)
    assert lr_factor(99, steps, warm, "cosine") < 1e-3
    assert lr_factor(99, steps, warm, "constant") == 1.0
    assert lr_factor(0, steps, 0, "linear") == 1.0


def _micro_batches(P: int, p: int, start: int = 0, steps: int = 5, micro: int = 2) -> list[list[int]]:
    return list(StepBatches(10, seed=3, batch_size=8, micro_batch_size=micro, num_processes=P, process_index=p,
                            start_step=start, steps=steps))


def test_data_order_is_a_function_of_step_and_independent_of_processes():
    one = _micro_batches(1, 0)
    assert len(one) == 5 * 4
    # Two processes interleave the same micro-batches.
    two = [_micro_batches(2, 0), _micro_batches(2, 1)]
    merged = [mb for k in range(10) for mb in (two[0][k], two[1][k])]
    assert merged == one
    # Resuming at step 2 reads exactly what an uninterrupted run reads from step 2 on.
    assert _micro_batches(1, 0, start=2) == one[2 * 4:]
    # Every epoch (10 rows) is a permutation; epochs differ.
    flat = [i for mb in one for i in mb]
    assert sorted(flat[:10]) == list(range(10)) and flat[:10] != flat[10:20]


def test_training_lowers_the_loss_and_logs_every_term(tmp_path):
    model = tiny_llama()
    args = quiet(tokens=SEQ * 8 * 30, batch_size=8, micro_batch_size=4, lr=3e-3, warmup=0.1, log_every=5)
    summary = train(LMObjective(model), model, RandomTokens(rows=16), args, tmp_path / "out")
    assert summary["steps"] == 30 and summary["grad_accumulation"] == 2 and summary["tokens"] == 30 * 8 * SEQ
    assert summary["metrics"] == str(tmp_path / "out.ckpt" / "metrics.jsonl")
    assert not (tmp_path / "out").exists()  # train() writes only into its checkpoint directory
    lines = [json.loads(x) for x in Path(summary["metrics"]).read_text().splitlines()]
    assert [x["step"] for x in lines] == [5, 10, 15, 20, 25, 30]
    for key in ("loss", "ce", "lr", "grad_norm", "tokens_per_s", "tokens"):
        assert all(math.isfinite(x[key]) for x in lines), key
    # the optimiser step's own time is a part of the step's
    assert all(0 < x["optimizer_cpu_s_per_step"] <= x["cpu_s_per_step"] and x["optimizer_s_per_step"] > 0
               for x in lines)
    assert lines[-1]["loss"] < lines[0]["loss"] - 0.3  # 16 rows memorised a little
    assert lines[0]["lr"] > lines[-1]["lr"]
    assert summary["peak_memory_mib"] > 0
    assert (tmp_path / "out.ckpt" / ckpt.DONE_FILE).is_file()
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "out.ckpt")] == ["step-000030"]


def test_zero_tokens_trains_nothing_but_finishes(tmp_path):
    model = tiny_llama()
    before = {n: p.clone() for n, p in model.named_parameters()}
    summary = train(LMObjective(model), model, RandomTokens(), quiet(tokens=0), tmp_path / "out")
    assert summary["steps"] == 0
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    assert Path(summary["metrics"]).read_text() == ""
    assert ckpt.read_done(tmp_path / "out.ckpt")["step"] == 0
    # A second call finds the job done.
    assert train(LMObjective(model), model, RandomTokens(), quiet(tokens=0), tmp_path / "out")["already_done"]


def test_frozen_parameters_are_not_trained(tmp_path):
    model = tiny_llama()
    model.model.embed_tokens.requires_grad_(False)
    frozen = model.model.embed_tokens.weight.clone()
    train(LMObjective(model), model, RandomTokens(), quiet(tokens=SEQ * 8 * 3, lr=1e-2), tmp_path / "out")
    assert torch.equal(frozen, model.model.embed_tokens.weight)
    saved = ckpt.list_checkpoints(tmp_path / "out.ckpt")[-1] / ckpt.TRAINABLE_FILE
    from safetensors.torch import load_file

    assert "model.embed_tokens.weight" not in load_file(str(saved))


def test_poisoned_batch_stops_with_step_and_term_and_keeps_last_checkpoint(tmp_path):
    # One row of step 5's batch carries a token whose embedding is inf: that batch poisons the
    # loss. (64 rows, 8 per step: steps 0-7 are one epoch, so the row is not drawn earlier.)
    order = 5
    row = _rows_of_step(order, rows=64, seed=0, batch_size=8)[0]
    data = RandomTokens(rows=64, poison=(row,))
    model = tiny_llama()
    with torch.no_grad():
        model.model.embed_tokens.weight[VOCAB - 1] = float("inf")
    args = quiet(tokens=SEQ * 8 * 8, batch_size=8, micro_batch_size=8, checkpoint_every=2, log_every=100)
    with pytest.raises(LRCError, match=rf"non-finite value at step {order + 1} .*in: loss, ce") as err:
        train(LMObjective(model), model, data, args, tmp_path / "out")
    assert "last good checkpoint" in str(err.value)
    kept = ckpt.list_checkpoints(tmp_path / "out.ckpt")
    # The two newest checkpoints before the poisoned step (steps 2 and 4), none after it.
    assert [p.name for p in kept] == [ckpt.step_dir_name(order - order % 2 - 2), ckpt.step_dir_name(order - order % 2)]
    from safetensors.torch import load_file

    weights = load_file(str(kept[-1] / ckpt.TRAINABLE_FILE))
    finite = {n: bool(torch.isfinite(t).all()) for n, t in weights.items() if n != "model.embed_tokens.weight"}
    assert all(finite.values())
    assert ckpt.read_done(tmp_path / "out.ckpt") is None


def _rows_of_step(step: int, *, rows: int, seed: int, batch_size: int) -> list[int]:
    sampler = StepBatches(rows, seed=seed, batch_size=batch_size, micro_batch_size=batch_size, num_processes=1,
                          process_index=0, start_step=step, steps=step + 1)
    return next(iter(sampler))


def test_resume_refuses_a_checkpoint_made_with_other_settings(tmp_path):
    model = tiny_llama()
    train(LMObjective(model), model, RandomTokens(), quiet(tokens=SEQ * 8 * 2, lr=1e-3), tmp_path / "out")
    with pytest.raises(LRCError, match=r"other settings \(lr differ\)"):
        train(LMObjective(model), model, RandomTokens(), quiet(tokens=SEQ * 8 * 2, lr=2e-3), tmp_path / "out")


def test_bad_batch_split_is_named():
    with pytest.raises(LRCError, match="--batch-size 6 must be a multiple of --micro-batch-size 4"):
        model = tiny_llama()
        train(LMObjective(model), model, RandomTokens(), quiet(tokens=SEQ * 6, batch_size=6, micro_batch_size=4),
              "/tmp/never-used-lrc-out")
    with pytest.raises(LRCError, match="--warmup"):
        TrainArgs(warmup=5)


def test_masked_ce_counts_only_masked_targets():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7)
    ids = torch.randint(0, 7, (2, 5))
    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[0, 3] = mask[1, 4] = True  # targets at positions 3 and 4, predicted from 2 and 3
    got = masked_ce(logits, {"input_ids": ids, "loss_mask": mask})
    lp = torch.log_softmax(logits, -1)
    want = -(lp[0, 2, ids[0, 3]] + lp[1, 3, ids[1, 4]]) / 2
    assert torch.allclose(got, want)
    # Changing a logit at an uncounted position changes nothing.
    logits2 = logits.clone()
    logits2[0, 0] += 5
    assert torch.equal(masked_ce(logits2, {"input_ids": ids, "loss_mask": mask}), got)


def test_kd_objective_is_zero_for_the_teacher_itself_and_trains_the_student():
    teacher, student = tiny_llama(0), tiny_llama(1)
    batch = RandomTokens(rows=2)[0]
    batch = {k: v[None] for k, v in batch.items()}
    self_kl, _ = KDObjective(teacher, teacher, temperature=2.0).loss(batch)
    assert abs(float(self_kl)) < 1e-5
    kl, terms = KDObjective(teacher, student, temperature=2.0).loss(batch)
    kl.backward()
    assert float(kl.detach()) > 0 and set(terms) == {"kl"}
    assert student.model.embed_tokens.weight.grad is not None and teacher.model.embed_tokens.weight.grad is None


# ---- shared helpers for the command tests (test_resume, test_sft, test_distill_cli) ------


def test_resume_survives_a_torn_metrics_line(tmp_path):
    model = tiny_llama()
    # keep_checkpoints="all": the full checkpoints a kill before DONE leaves (retention runs after it).
    args = quiet(tokens=SEQ * 8 * 4, log_every=1, checkpoint_every=2, keep_checkpoints="all")
    train(LMObjective(model), model, RandomTokens(), args, tmp_path / "out")
    # Simulate a kill after step 2's checkpoint, mid-write of a later log line.
    ckpt_dir = tmp_path / "out.ckpt"
    (ckpt_dir / ckpt.DONE_FILE).unlink()
    assert [p.name for p in ckpt.list_checkpoints(ckpt_dir)] == [ckpt.step_dir_name(2), ckpt.step_dir_name(4)]
    shutil.rmtree(ckpt_dir / ckpt.step_dir_name(4))
    with open(ckpt_dir / ckpt.METRICS_FILE, "a") as fh:
        fh.write('{"step": 5, "loss"')
    model = tiny_llama()
    summary = train(LMObjective(model), model, RandomTokens(), args, tmp_path / "out")
    assert summary["resumed_from"].endswith(ckpt.step_dir_name(2))
    steps = [json.loads(x)["step"] for x in Path(summary["metrics"]).read_text().splitlines()]
    assert steps == [1, 2, 3, 4]


def _busy(seconds: float) -> None:
    """At least ``seconds`` of this process's CPU time and of wall time (other threads, gloo's,
    can advance the process's CPU clock faster than the wall clock)."""
    end_cpu, end_wall = time.process_time() + seconds, time.perf_counter() + seconds
    while time.process_time() < end_cpu or time.perf_counter() < end_wall:
        pass


def test_the_optimiser_step_time_is_what_runs_inside_the_timer(tmp_path):
    from accelerate import Accelerator

    from lrc.training.steplog import StepLog

    log = StepLog(Accelerator(cpu=True), tmp_path, steps=2, start_step=0, tokens_per_step=4, progress=False)
    for step in range(2):
        log.record(step, torch.ones(3), ["ce"])  # [loss, ce, grad_norm]
        with log.timing_optimizer():
            time.sleep(0.05)  # wall, not CPU
            _busy(0.05)
    log.write(2, 1e-3)
    record = json.loads((tmp_path / ckpt.METRICS_FILE).read_text())
    assert 0.1 <= record["optimizer_s_per_step"] < record["elapsed_s"] / 2 + 0.01
    assert 0.05 <= record["optimizer_cpu_s_per_step"] <= record["cpu_s_per_step"]
    assert record["optimizer_s_per_step"] - record["optimizer_cpu_s_per_step"] >= 0.04  # the sleep counts as wall only
    # one process: it is the slowest
    assert record["optimizer_cpu_s_per_step_max"] == record["optimizer_cpu_s_per_step"]


def _slowest_process_worker(rank: int, port: int, ckpt_dir: str) -> None:
    import os

    from accelerate import Accelerator

    from lrc.training.steplog import StepLog

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="2")
    acc = Accelerator(cpu=True)
    log = StepLog(acc, Path(ckpt_dir), steps=1, start_step=0, tokens_per_step=4, progress=False)
    log.record(0, torch.ones(3), ["ce"])
    with log.timing_optimizer():
        _busy(0.2 if rank == 1 else 0.0)  # process 1 holds the costly basis changes
    log.write(1, 1e-3)
    acc.end_training()


@pytest.mark.slow
def test_the_slowest_process_optimiser_time_is_logged_beside_process_0s(tmp_path):
    """Under DDP the metrics line has process 0's times and, as *_max, the slowest process's."""
    import torch.multiprocessing as mp

    from tests.helpers import free_port

    mp.spawn(_slowest_process_worker, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    record = json.loads((tmp_path / ckpt.METRICS_FILE).read_text())
    assert record["optimizer_cpu_s_per_step"] < 0.05 <= 0.2 <= record["optimizer_cpu_s_per_step_max"]
    assert record["cpu_s_per_step_max"] >= record["optimizer_cpu_s_per_step_max"]
    assert record["optimizer_s_per_step_max"] >= 0.2


class _StopAt:
    """A StepLog hook that stops the run after ``step`` (an interruption, as a kill would be)."""

    def __init__(self, step: int):
        self.step = step

    def begin(self, ckpt_dir, *, start_step, steps, tokens_per_step):
        pass

    def after_step(self, done_step):
        if done_step == self.step:
            raise KeyboardInterrupt


def test_a_resumed_run_says_where_it_resumed_and_how_much_it_trained(tmp_path, capsys):
    model = tiny_llama()
    args = quiet(tokens=SEQ * 8 * 4, batch_size=8, lr=1e-3, checkpoint_every=2)
    with pytest.raises(KeyboardInterrupt):
        train(LMObjective(model), model, RandomTokens(rows=16), args, tmp_path / "out", hook=_StopAt(3))
    capsys.readouterr()
    train(LMObjective(model), model, RandomTokens(rows=16), args, tmp_path / "out")
    out = capsys.readouterr().out
    assert f"resuming from {tmp_path / 'out.ckpt' / 'step-000002'}: step 2 of 4" in out, out
    assert f"trained {SEQ * 8 * 4:,} tokens in 4 steps (2 of them here, resumed at step 2)" in out, out


def test_trackers_get_the_records_of_metrics_jsonl(tmp_path):
    """TensorBoard (accelerate's tracker) logs every record metrics.jsonl holds, at its step; a tracker
    that is not installed is refused before any work; none logs nowhere."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = tiny_llama()
    args = quiet(tokens=SEQ * 8 * 6, batch_size=8, micro_batch_size=8, lr=3e-3, log_every=2, trackers=["tensorboard"])
    summary = train(LMObjective(model), model, RandomTokens(rows=16), args, tmp_path / "out")
    lines = [json.loads(x) for x in Path(summary["metrics"]).read_text().splitlines()]
    (run,) = (tmp_path / "out.ckpt" / "tb").iterdir()
    events = EventAccumulator(str(run))
    events.Reload()
    logged = [(e.step, e.value) for e in events.Scalars("train/loss")]
    assert logged == [(x["step"], pytest.approx(x["loss"], rel=1e-6)) for x in lines] and len(logged) == 3
    assert {"train/ce", "train/grad_norm", "train/lr", "train/tokens"} <= set(events.Tags()["scalars"])

    with pytest.raises(LRCError, match="--trackers wandb: the wandb package is not installed"):
        quiet(trackers=["wandb"])
    with pytest.raises(LRCError, match="choose from auto, none, tensorboard"):
        quiet(trackers=["tensorbored"])
    train(LMObjective(model), model, RandomTokens(rows=16), quiet(tokens=SEQ * 8, batch_size=8, trackers=["none"]),
          tmp_path / "quiet")
    assert not (tmp_path / "quiet.ckpt" / "tb").exists()
