"""``--recompute-teacher`` (:mod:`lrc.method.clone`): with the student's layers checkpointed, the
teacher keeps only each layer's input and its layer reruns inside the student's, in the
forward and in the recompute. The loss, every term and every gradient are bitwise those of
plain checkpointing; the teacher's layers run three times; the clone terms' activations
shrink to one teacher-width input per layer."""

from __future__ import annotations

import json

import pytest
import torch

from lrc.errors import LRCError
from lrc.io.hf import trainable_parameters
from lrc.method.clone import CloneObjective, RecipeArgs
from lrc.training import recompute
from lrc.training.loop import TrainArgs
from lrc.training.memory import StepSpec, trace_step
from tests.helpers import make_teacher
from tests.launch import ATOL, RTOL, compare, distill_flags, launch, run
from tests.recompute_helpers import ARM_IMPLS, fit, masked_batch, perturbed_student
from tests.workflow_helpers import ROOT, default_config, rule_shells


def _loss_and_grads(student, objective, rerun_teacher):
    recompute.enable(student)
    objective.recompute_teacher = rerun_teacher
    student.zero_grad(set_to_none=True)
    with recompute.micro_batch(student):
        total, terms = objective.loss(masked_batch(), model=student)
        total.backward()
    grads = {n: p.grad.clone() for n, p in trainable_parameters(student)}
    return total.detach(), terms, grads


def _teacher_layer_runs(teacher):
    runs = [0]
    handles = [layer.input_layernorm.register_forward_hook(lambda *_: runs.__setitem__(0, runs[0] + 1))
               for layer in teacher.model.layers]
    return runs, handles


def _assert_same(a, b):
    (total_a, terms_a, grads_a), (total_b, terms_b, grads_b) = a, b
    assert torch.equal(total_a, total_b), (total_a, total_b)
    assert terms_a.keys() == terms_b.keys() and all(torch.equal(terms_a[k], terms_b[k]) for k in terms_a)
    assert grads_a.keys() == grads_b.keys() and all(g.abs().sum() > 0 for g in grads_a.values())
    for name, g in grads_a.items():
        assert torch.equal(grads_b[name], g), name


@pytest.mark.parametrize("arm,core_impl", ARM_IMPLS)
@pytest.mark.parametrize(("recipe", "loss_impl"), [(dict(), "fused"), (dict(clone_norm="teacher_ms"), "reference"),
                                                   (dict(clone_terms=["gate", "up", "mlp_out"], clone_layers=[1]),
                                                    "fused")])
def test_the_same_loss_terms_and_gradients_as_plain_checkpointing(arm, core_impl, recipe, loss_impl):
    teacher, student = perturbed_student("llama-tied", arm, core_impl)
    objective = CloneObjective(teacher, student, RecipeArgs(temperature=2.0, **recipe), loss_impl=loss_impl)
    plain = _loss_and_grads(student, objective, False)
    runs, handles = _teacher_layer_runs(teacher)
    rerun = _loss_and_grads(student, objective, True)
    for h in handles:
        h.remove()
    _assert_same(plain, rerun)
    n_layers, clone_layers = len(teacher.model.layers), len(objective.layers)
    # every layer in the teacher's forward, each clone layer again in the student's forward and in its recompute
    assert runs[0] == n_layers + 2 * clone_layers
    assert not objective._s.calls and not objective._s.teacher_acts  # nothing of the teacher outlives the backward
    assert objective.layer_terms()["mse"].keys() == {(i, t) for i in objective.layers for t in objective.terms}
    recompute.disable(student)


def test_under_bf16_autocast_too():
    teacher, student = perturbed_student("qwen2-untied", "core", "parametrized")
    objective = CloneObjective(teacher, student, RecipeArgs(temperature=2.0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _assert_same(_loss_and_grads(student, objective, False), _loss_and_grads(student, objective, True))


def test_without_gradients_or_clone_terms_the_teacher_runs_once():
    """Evaluation (no gradients) and the kl recipe take the plain path: nothing to recompute."""
    teacher, student = perturbed_student("llama-tied", "dense")
    recompute.enable(student)
    for recipe, grad in ((RecipeArgs(temperature=2.0), False), (RecipeArgs(recipe="kl", temperature=2.0), True)):
        objective = CloneObjective(teacher, student, recipe, recompute_teacher=True)
        runs, handles = _teacher_layer_runs(teacher)
        with torch.set_grad_enabled(grad), recompute.micro_batch(student):
            total, _ = objective.loss(masked_batch(), model=student)
            if grad:
                total.backward()
        for h in handles:
            h.remove()
        assert runs[0] == len(teacher.model.layers) and not objective._s.calls
        objective.close()


def _clone_widths(cfg, r: int) -> int:
    head = cfg.hidden_size // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * head, cfg.num_key_value_heads * head
    return q + 2 * kv + cfg.hidden_size + 2 * cfg.intermediate_size + r  # q, k, v, attn_out, gate, up, mlp_out


@pytest.mark.slow
def test_the_traced_step_keeps_one_teacher_input_per_layer_instead_of_the_terms():
    cfg = make_teacher("llama-tied", vocab_size=4000).config
    cfg.num_hidden_layers = 4
    spec = dict(teacher_config=cfg, student_hidden=16, arm="core", micro_batch_size=2, seq_len=64, precision="fp32",
                activation_checkpointing=True)
    plain, rerun = trace_step(StepSpec(**spec)), trace_step(StepSpec(**spec, recompute_teacher=True))
    tokens_layers_bytes = 2 * 64 * cfg.num_hidden_layers * 4
    # the terms' s - t, less the kept inputs
    expected = tokens_layers_bytes * (_clone_widths(cfg, 16) - cfg.hidden_size)
    saved = plain["parts"]["activations"] - rerun["parts"]["activations"]
    assert abs(saved - expected) <= 0.05 * expected, (saved, expected)
    assert rerun["peak"] < plain["peak"]
    for part in ("student_weights", "teacher", "optimizer"):
        assert rerun["parts"][part] == plain["parts"][part]


def _train(out, arm, rerun_teacher, steps=4):
    teacher, student = perturbed_student("llama-tied", arm, "optimizer" if arm == "core" else None)
    objective = CloneObjective(teacher, student, RecipeArgs(temperature=2.0), recompute_teacher=rerun_teacher)
    runs, handles = _teacher_layer_runs(teacher)
    trained = fit(objective, student, out, steps, activation_checkpointing=True, recompute_teacher=rerun_teacher)
    for h in handles:
        h.remove()
    # per micro-batch: the teacher's forward, and (recomputed) each layer twice more
    assert runs[0] == steps * 2 * len(teacher.model.layers) * (3 if rerun_teacher else 1)
    return trained


@pytest.mark.parametrize("arm", ["slice", "core"])
def test_a_few_optimizer_steps_give_bitwise_the_same_weights(tmp_path, arm):
    plain, s_plain = _train(tmp_path / "plain", arm, False)
    rerun, s_rerun = _train(tmp_path / "rerun", arm, True)
    assert s_plain["final"] == s_rerun["final"]
    assert all(torch.equal(rerun[n], w) for n, w in plain.items())


def test_it_needs_checkpointing_and_reaches_the_commands_and_configs():
    from lrc.commands.distill import DistillArgs
    from lrc.options import parse_args
    from lrc.workflow import config as wc

    with pytest.raises(LRCError, match="recompute-teacher.*activation-checkpointing"):
        TrainArgs(recompute_teacher=True)
    base = ["--teacher", "t", "--data", "d", "--out", "o", "--arm", "core", "--warmstart", "w",
            "--activation-checkpointing"]
    assert parse_args(DistillArgs, base + ["--recompute-teacher"], prog="lrc distill").recompute_teacher
    assert not parse_args(DistillArgs, base, prog="lrc distill").recompute_teacher
    config = default_config()
    train_cfg = config["experiments"]["tiny"]["distill"]["train"]
    train_cfg.update(activation_checkpointing=True, recompute_teacher=True)
    assert wc.config_problems(config, rule_shells(), workdir=ROOT) == []
    assert "--recompute-teacher" in wc.cli_flags(train_cfg)


@pytest.mark.slow
@pytest.mark.parametrize("world", ["llama-tied"], indirect=True)
def test_fsdp2_two_processes_with_the_teacher_recomputed_follow_one_plain_process(world, tmp_path):
    """The real launch: FSDP2 gathers each student layer in its pre-backward hook, before the
    recompute that reruns the teacher's layer (replicated, never wrapped) inside it."""
    from lrc.commands.distill import main_distill

    assert main_distill(distill_flags(world, tmp_path / "p1", "core")) == 0
    run(launch("-m", "lrc.cli", "distill",
               *distill_flags(world, tmp_path / "p2", "core", 8, "--activation-checkpointing", "--recompute-teacher")))
    settings = json.loads((tmp_path / "p2" / "settings.json").read_text())["training"]
    assert (settings["num_processes"], settings["grad_accumulation"]) == (2, 2)
    rel, diff = compare(tmp_path / "p1", tmp_path / "p2")
    print(f"FSDP2, 2 processes, teacher recomputed vs 1 plain process: max relative loss difference {rel:.2e}, "
          f"max |weight difference| {diff:.2e}")
    assert rel < RTOL and diff < ATOL, (rel, diff)


def test_backward_recomputes_one_layer_at_a_time():
    """The autograd engine runs the ready node of the highest sequence number first, so layer
    i's clone terms (created in its forward) are backpropagated after every later layer's
    backward: the teacher's layer i reruns only once the gradient has left layer i + 1, and
    no two layers' recomputed tensors are alive together."""
    from transformers import LlamaForCausalLM

    from lrc.method.student import build_student

    cfg = make_teacher("llama-tied").config
    cfg.num_hidden_layers = 4
    torch.manual_seed(0)
    teacher = LlamaForCausalLM(cfg)
    student = build_student(teacher, 16, seed=3).train()
    objective = CloneObjective(teacher, student, RecipeArgs(temperature=2.0), recompute_teacher=True)
    recompute.enable(student)
    events, in_backward = [], [False]
    for i, layer in enumerate(teacher.model.layers):
        layer.register_forward_pre_hook(lambda *_, i=i: events.append(("teacher", i)) if in_backward[0] else None)

    def grad_in(i):
        def pre_hook(_layer, args):  # outside the checkpoint: the layer's __call__ runs once
            if args[0].requires_grad:
                args[0].register_hook(lambda g: events.append(("left", i)))
        return pre_hook

    for i, layer in enumerate(student.model.layers):
        layer.register_forward_pre_hook(grad_in(i))
    with recompute.micro_batch(student):
        total, _ = objective.loss(masked_batch(), model=student)
        in_backward[0] = True
        total.backward()
    assert events == [e for i in reversed(range(4)) for e in (("teacher", i), ("left", i))], events
