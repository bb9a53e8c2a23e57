"""The loop's guards against runs that exit 0 without training properly (lrc.training.guards):
a budget that buys no optimiser step, and a loss that diverges while staying finite."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from lrc.errors import LRCError
from lrc.method.objectives import LMObjective
from lrc.training import checkpoint as ckpt
from lrc.training.guards import DivergenceGuard
from lrc.training.loop import TrainArgs, train
from tests.helpers import SEQ, RandomTokens, make_tokenizer, tiny_llama, write_corpus, write_llama_config


def quiet(**kw) -> TrainArgs:
    return TrainArgs(progress=False, **kw)


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


# ---- a budget that buys no step --------------------------------------------------------


@pytest.mark.parametrize("tokens, batch_size", [(SEQ * 8 - 1, 8), (500, 64)], ids=["one-token-short", "big-batch"])
def test_a_budget_that_buys_no_step_is_refused_before_any_work(tmp_path, tokens, batch_size):
    model = tiny_llama()
    before = weights(model)
    args = quiet(tokens=tokens, batch_size=batch_size, micro_batch_size=batch_size)
    with pytest.raises(LRCError) as err:
        train(LMObjective(model), model, RandomTokens(), args, tmp_path / "out")
    message = str(err.value)
    per_step = batch_size * SEQ
    assert f"--tokens {tokens} buys no optimiser step" in message
    assert f"--batch-size {batch_size} sequences x seq_len {SEQ} tokens (the training data's) = {per_step}" in message
    assert f"--tokens of at least {per_step}" in message and "--tokens 0" in message
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.ckpt").exists()  # no checkpoint, no output
    assert same(before, weights(model))
    # --tokens 0 stays a deliberate zero-step run (a warm start left at its initialisation).
    zero = quiet(tokens=0, batch_size=batch_size, micro_batch_size=batch_size)
    assert train(LMObjective(model), model, RandomTokens(), zero, tmp_path / "zero")["steps"] == 0


def test_lrc_pretrain_refuses_a_budget_below_one_step_and_writes_nothing(tmp_path):
    from lrc.commands.pretrain import main

    tok = make_tokenizer(tmp_path / "tok")
    write_corpus(tmp_path / "data", tok, rows=16, seq_len=16)
    write_llama_config(tmp_path / "config.json", len(tok))
    out = tmp_path / "out"
    with pytest.raises(LRCError, match=r"--tokens 500 buys no optimiser step: one step takes --batch-size 64 .*= 1024"):
        main(["--model-config", str(tmp_path / "config.json"), "--tokenizer", str(tmp_path / "tok"),
              "--data", str(tmp_path / "data"), "--tokens", "500", "--batch-size", "64", "--micro-batch-size", "64",
              "--no-progress", "--out", str(out)])
    assert not out.exists() and not (tmp_path / "out.ckpt").exists()


# ---- divergence: the guard alone -------------------------------------------------------


def found(losses, *, factor=10.0, steps=20, warmup=0) -> list[float]:
    """The guard's [step, loss, level, streak] after ``losses`` (one per step)."""
    guard = DivergenceGuard(factor=factor, steps=steps, warmup=warmup, device="cpu")
    for i, x in enumerate(losses):
        guard.update(i, torch.tensor(float(x)))
    return guard.state().tolist()


def noisy(n: int, level, seed: int = 0, spread: float = 0.3) -> list[float]:
    g = torch.Generator().manual_seed(seed)
    noise = 1 + spread * (2 * torch.rand(n, generator=g) - 1)
    return [float(level(i)) * float(e) for i, e in enumerate(noise)]


def test_falling_and_levelling_loss_curves_never_trip_the_guard():
    # From the start, no warm-up: a fast fall, an early plateau, a second fall, a noisy floor.
    curve = noisy(2000, lambda i: 6.0 if i < 40 else 1 + 5 * math.exp(-(i - 40) / 30) if i < 400 else 0.05 + 0.95
                  * math.exp(-(i - 400) / 200))
    assert found(curve)[0] == -1
    # A bump that does not last (19 steps at 100x) is no divergence; 20 steps are.
    assert found([1.0] * 50 + [100.0] * 19 + [1.0] * 50)[0] == -1
    assert found([1.0] * 50 + [100.0] * 20 + [1.0] * 50)[:3] == [69.0, 100.0, 1.0]
    # A loss that was 0 at every step has no scale; non-finite losses are the other guard's (and are not averaged).
    assert found([0.0] * 30 + [1e-3] * 50)[0] == -1
    assert found([1.0] * 30 + [math.nan, math.inf] * 20 + [1.0] * 30)[0] == -1


def test_a_plateau_or_a_slow_climb_far_above_the_best_level_is_found():
    # A jump to a plateau 1e9 times higher inside the warm-up: the warm-up ends at step 100, the 20th high step
    # after it is step 119 (0-based), measured against the level before the jump.
    step, loss, level, _ = found([2.0] * 50 + [2e9] * 200, warmup=100)
    assert (step, loss, level) == (119.0, 2e9, 2.0)
    # A climb of 5 % a step: a moving average follows it within a factor 6, the best level does not.
    climb = found([2.0] * 100 + [2.0 * 1.05**i for i in range(200)])
    assert climb[0] > 0 and climb[1] > 10 * climb[2] and climb[2] == pytest.approx(2.0)
    # Off: factor 0 or steps 0.
    assert not DivergenceGuard(factor=0, steps=20, warmup=0, device="cpu").enabled
    assert not DivergenceGuard(factor=10, steps=0, warmup=0, device="cpu").enabled


@pytest.mark.parametrize("changes, message", [({"divergence_factor": 1.0}, "--divergence-factor must be > 1"),
                                              ({"divergence_steps": -1}, "--divergence-steps must be >= 0"),
                                              ({"divergence_warmup": -1}, "--divergence-warmup must be >= 0")])
def test_divergence_settings_are_checked(changes, message):
    with pytest.raises(LRCError, match=message):
        TrainArgs(**changes)


# ---- divergence: in the loop -----------------------------------------------------------


class Inflated:
    """``LMObjective`` whose reported loss is ``by`` times larger on optimiser steps ``[first, last)``
    (0-based); the gradient stays the plain loss's (the inflation is a detached term), so the
    trajectory is that of the plain objective."""

    def __init__(self, model, *, accum: int, first: int, last: int = 10**9, by: float = 1000.0):
        self.inner, self.accum, self.first, self.last, self.by = LMObjective(model), accum, first, last, by
        self.calls = 0

    def loss(self, batch, model=None):
        total, terms = self.inner.loss(batch, model=model)
        step, self.calls = self.calls // self.accum, self.calls + 1
        if self.first <= step < self.last:
            total = total + (self.by - 1) * total.detach()
        return total, terms


GUARD = dict(divergence_factor=10.0, divergence_steps=20, divergence_warmup=5)
RUN = dict(batch_size=4, micro_batch_size=2, lr=3e-3, warmup=0.1, log_every=10, checkpoint_every=2)


def test_a_diverging_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    # The reported loss jumps 1000x at step 7 (0-based) and stays there: the 20th high step is
    # step 26, checked at once (the checkpoints due from step 8 on wait for the loss to come back).
    steps, first = 40, 7
    model = tiny_llama()
    args = quiet(tokens=steps * 4 * SEQ, **RUN, **GUARD)
    with pytest.raises(LRCError, match=rf"the loss diverged: at step {first + 20} \(1-based\) it was .*above 10x the "
                                       rf"run's best level .* for 20 consecutive steps, since step {first + 1}") as err:
        train(Inflated(model, accum=2, first=first), model, RandomTokens(rows=16), args, tmp_path / "out")
    kept = ckpt.list_checkpoints(tmp_path / "out.ckpt")
    assert [p.name for p in kept] == ["step-000004", "step-000006"]  # none from the diverged steps
    assert f"stopped without saving; the last good checkpoint is kept: {kept[-1]}" in str(err.value)
    assert ckpt.read_done(tmp_path / "out.ckpt") is None
    assert all(torch.isfinite(t).all() for t in load_file(str(kept[-1] / ckpt.TRAINABLE_FILE)).values())

    # That checkpoint is intact: a rerun with the guard off resumes from it and ends where a run
    # that never stopped ends (the inflation does not touch the gradient).
    resumed = tiny_llama()
    summary = train(LMObjective(resumed), resumed, RandomTokens(rows=16),
                    quiet(tokens=steps * 4 * SEQ, **RUN, **(GUARD | {"divergence_factor": 0})), tmp_path / "out")
    assert summary["resumed_from"] == str(kept[-1]) and summary["steps"] == steps
    straight = tiny_llama()
    train(LMObjective(straight), straight, RandomTokens(rows=16),
          quiet(tokens=steps * 4 * SEQ, **RUN, divergence_factor=0), tmp_path / "straight")
    assert same(weights(resumed), weights(straight))


def test_a_huge_learning_rate_is_stopped_by_the_default_guard(tmp_path):
    # The case (lr 3: the loss climbs by orders of magnitude, finite) in a run of 19 steps,
    # the length of config/test.yaml's: with the defaults (5 steps of warm-up, then 10 steps above
    # 10x the best level) it stops at step 15, long before the run's end. The loss is high from the
    # second step on, in the warm-up too: the checkpoints due then wait, the first one is kept.
    model = tiny_llama()
    args = quiet(tokens=19 * 4 * SEQ, batch_size=4, micro_batch_size=4, lr=3.0, log_every=10, checkpoint_every=1)
    assert (args.divergence_factor, args.divergence_steps, args.divergence_warmup) == (10.0, 10, 5)
    with pytest.raises(LRCError, match=r"the loss diverged: at step 15 \(1-based\)") as err:
        train(LMObjective(model), model, RandomTokens(rows=16), args, tmp_path / "out")
    assert "lower --lr" in str(err.value) and str(tmp_path / "out.ckpt" / "step-000001") in str(err.value)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "out.ckpt")] == ["step-000001"]
    assert ckpt.read_done(tmp_path / "out.ckpt") is None


def test_the_guard_does_not_change_training_and_a_spike_only_delays_a_checkpoint(tmp_path):
    # Guard on (no warm-up), a reported spike of 5 steps (7-11, 0-based) inside a checkpoint
    # interval: the run finishes, the checkpoint due after step 8 is written after step 13 instead,
    # and the weights are bitwise those of the same run with the guard off.
    steps = 16
    on, off = tiny_llama(), tiny_llama()
    common = dict(tokens=steps * 4 * SEQ, batch_size=4, micro_batch_size=2, lr=3e-3, warmup=0.1, log_every=10,
                  checkpoint_every=4, keep_checkpoints="all")
    summary = train(Inflated(on, accum=2, first=7, last=12), on, RandomTokens(rows=16),
                    quiet(**common, divergence_factor=10.0, divergence_steps=6, divergence_warmup=0), tmp_path / "on")
    train(LMObjective(off), off, RandomTokens(rows=16), quiet(**common, divergence_factor=0), tmp_path / "off")
    assert summary["steps"] == steps and ckpt.read_done(tmp_path / "on.ckpt") is not None
    assert same(weights(on), weights(off))
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "on.ckpt")] == ["step-000013", "step-000016"]
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "off.ckpt")] == ["step-000012", "step-000016"]
