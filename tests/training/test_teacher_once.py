"""The frozen teacher weights held once: the student's parametrisations read the teacher
module's own tensors (no copy, the teacher's dtype), so a bf16 teacher under autocast is
neither copied nor cast and saved per forward, and the arms compute what they computed
when the student held fp32 copies (an fp32 teacher under autocast is that path)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.nn.utils import parametrize

from lrc.io.hf import cast_weights
from lrc.method.clone import CloneObjective, RecipeArgs
from lrc.method.reach import apply_arm
from lrc.method.spectral import compute_bases
from lrc.method.student import build_student
from lrc.names import ARMS
from lrc.training.memory import StepSpec, trace_step
from tests.helpers import TEACHER_KINDS, make_teacher

R = 8  # no factor or student weight shares a shape with a teacher matrix (32, 16, 96, 97 wide)


def _storages(tensors) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors}


def _teacher_matrices(teacher) -> list[torch.Tensor]:
    return [p for p in teacher.parameters() if p.dim() == 2]


def _student_tensors(student) -> list[torch.Tensor]:
    named = list(student.named_parameters(remove_duplicate=False)) + list(student.named_buffers(remove_duplicate=False))
    return [t for _, t in named]


def _parametrisations(student):
    for module in student.modules():
        if parametrize.is_parametrized(module):
            yield from module.parametrizations.weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("arm", ARMS)
@pytest.mark.parametrize("kind", ["llama-tied", "qwen2-untied"])
def test_the_student_holds_no_copy_of_a_teacher_weight(kind, arm, dtype):
    teacher = make_teacher(kind)
    student = build_student(teacher, R, seed=1)
    apply_arm(student, teacher, arm, core_impl="parametrized" if arm == "randcomp" else "optimizer")
    cast_weights(teacher, dtype)  # what lrc.training.loop.place_teacher does under bf16 on a GPU, after the build
    matrices = _teacher_matrices(teacher)
    # Nothing the student holds (parameters, buffers, the coordinate maps' buffers) lives in a
    # teacher storage, nor equals a teacher matrix in any dtype.
    held = _student_tensors(student)
    assert not _storages(held) & _storages(matrices)
    for w in matrices:
        assert not any(t.shape == w.shape and torch.equal(t.detach().to(w.dtype), w) for t in held)
    # What the parametrisations read is the teacher's own Parameter, in the teacher's dtype.
    reads = [m.frozen for m in _parametrisations(student) if hasattr(m, "teacher_tensor")]
    assert reads and all(any(t is w for w in matrices) and t.dtype == dtype for t in reads)
    # (randcomp, parametrised here, is a complement path T·F + U_perp·C: it reads the MLP's T too)
    n_mlp = 0 if arm in ("slice", "randcomp") else 3 * teacher.config.num_hidden_layers
    assert len(reads) == 7 * teacher.config.num_hidden_layers + 2 - n_mlp  # q k v o gate up down, embedding, head


def test_a_deep_copy_of_the_student_reads_the_same_teacher():
    teacher = make_teacher("llama-untied")
    student = build_student(teacher, R)
    twin = copy.deepcopy(student)
    assert (twin.model.layers[0].self_attn.q_proj.parametrizations.weight[0].frozen
            is teacher.model.layers[0].self_attn.q_proj.weight)
    assert torch.equal(twin.model.layers[0].self_attn.q_proj.weight, student.model.layers[0].self_attn.q_proj.weight)


def _batch(vocab: int = 97) -> dict:
    # 21 tokens: no activation of a teacher shape
    ids = torch.randint(0, vocab, (3, 7), generator=torch.Generator().manual_seed(3))
    return {"input_ids": ids, "loss_mask": torch.ones_like(ids, dtype=torch.bool)}


def _saved_tensors_of_loss(objective, student):
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            total, _ = objective.loss(_batch(), model=student)
    total.backward()
    return saved


@pytest.mark.parametrize("kind", TEACHER_KINDS)
def test_bf16_autocast_saves_no_cast_of_a_teacher_weight(kind):
    teacher = make_teacher(kind)
    student = build_student(teacher, R, seed=2)
    objective = CloneObjective(teacher, student, RecipeArgs(temperature=2.0))
    teacher.to(torch.bfloat16)
    student.train()
    saved = _saved_tensors_of_loss(objective, student)
    matrices = _teacher_matrices(teacher)
    shapes = {tuple(w.shape) for w in matrices} | {tuple(w.shape)[::-1] for w in matrices}
    own = _storages(matrices)
    teacher_sized = [t for t in saved if t.dim() == 2 and tuple(t.shape) in shapes]
    # Every teacher-sized tensor autograd saves is the teacher's own (a view of it, bf16),
    # and each matrix the student reads is saved (so the check looks where the casts were).
    assert teacher_sized and all(t.untyped_storage().data_ptr() in own and t.dtype == torch.bfloat16
                                 for t in teacher_sized)
    assert len(_storages(teacher_sized)) == len(own)
    assert all(p.grad is not None for p in student.parameters() if p.requires_grad)


def _twin_students(kind: str, arm: str, core_impl: str):
    """Two students of one fp32 teacher and its copy; the copy then cast to bf16."""
    t32 = make_teacher(kind)
    t16 = copy.deepcopy(t32)
    bases = compute_bases(t32) if arm in ("core", "confined", "randcomp") else None
    students = []
    for t in (t32, t16):
        s = build_student(t, R, seed=4)
        apply_arm(s, t, arm, bases=bases, seed=5, core_impl=core_impl)
        students.append(s)
    t16.to(torch.bfloat16)
    return t32, t16, students


@pytest.mark.parametrize("arm,core_impl",
                         [(a, "optimizer") for a in ARMS] + [("core", "parametrized"), ("randcomp", "parametrized")])
@pytest.mark.parametrize("kind", ["llama-tied", "qwen2-untied"])
def test_a_bf16_teacher_gives_the_fp32_teachers_autocast_results(kind, arm, core_impl):
    """Under bf16 autocast the fp32 teacher's weights (what the student's fp32 copies were)
    are cast to bf16 in every forward; the bf16 teacher is that cast, made once: the
    student's weights, logits and gradients are bitwise those of the fp32 teacher."""
    _, _, (s32, s16) = _twin_students(kind, arm, core_impl)
    ids = _batch()["input_ids"]
    outs = []
    for s in (s32, s16):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = s(input_ids=ids, use_cache=False).logits
        logits.float().square().mean().backward()
        outs.append((logits.detach(), {n: p.grad for n, p in s.named_parameters() if p.requires_grad}))
    assert torch.equal(outs[0][0], outs[1][0])
    assert outs[0][1].keys() == outs[1][1].keys() and all(torch.equal(outs[0][1][n], outs[1][1][n]) for n in outs[0][1])


def test_fp32_student_of_a_bf16_teacher_without_autocast_reads_it_upcast():
    """A bf16 teacher and fp32 factors outside autocast (``lrc bench`` of a bf16 config):
    the product takes the teacher upcast, what an fp32 copy of it held."""
    teacher = make_teacher("llama-untied").to(torch.bfloat16)
    student = build_student(teacher, R, seed=6)
    a = student.model.layers[0].self_attn.q_proj.parametrizations.weight.original
    w = student.model.layers[0].self_attn.q_proj.weight
    assert w.dtype == torch.float32 and torch.equal(w, teacher.model.layers[0].self_attn.q_proj.weight.float() @ a)


def test_the_plan_counts_each_teacher_weight_once_in_bf16():
    """The planner's trace (fake tensors, the real step): under bf16, its 'teacher + frozen'
    of a slice student is the bf16 teacher and the small buffers (rotary tables), nothing of
    a teacher weight's size more (the fp32 copies were 2x the bf16 teacher)."""
    teacher = make_teacher("llama-untied", vocab_size=512)
    student = build_student(teacher, R)
    cast_weights(teacher, torch.bfloat16)  # as placed on a GPU: bf16 weights, fp32 rotary tables
    frozen = [p for p in student.parameters() if not p.requires_grad] + [b for b in student.buffers() if b.dim() < 2]
    expected = sum(t.nbytes for t in [*teacher.parameters(), *teacher.buffers(), *frozen])
    result = trace_step(StepSpec(teacher_config=teacher.config, student_hidden=R, arm="slice", micro_batch_size=1,
                                 seq_len=32, precision="bf16"))
    assert result["parts"]["teacher"] == expected


def test_a_bf16_teacher_keeps_its_rotary_frequencies_in_fp32():
    """The bf16 cast of the teacher's weights leaves RoPE's inv_freq in fp32, as
    from_pretrained(dtype=bf16) does: cast with it, at Llama-3.2's theta and head size the
    angles up to position 2047 are those of fp32 (cos/sin within bf16's rounding), where
    Module.to(bf16) turns some by radians."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=128, intermediate_size=64, num_hidden_layers=1, num_attention_heads=1,
                      num_key_value_heads=1, head_dim=128, vocab_size=16, rope_theta=500000.0,
                      max_position_embeddings=2048)
    torch.manual_seed(0)
    fp32 = LlamaForCausalLM(cfg)
    positions = torch.arange(2048)[None]
    x = torch.zeros(1, 2048, 128)
    cos32, sin32 = fp32.model.rotary_emb(x, positions)

    def rotary(model):
        return [t.float() for t in model.model.rotary_emb(x.bfloat16(), positions)]

    cast = cast_weights(copy.deepcopy(fp32), torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in cast.parameters())
    assert cast.model.rotary_emb.inv_freq.dtype == torch.float32
    cos, sin = rotary(cast)
    assert (cos - cos32).abs().max() < 1e-2 and (sin - sin32).abs().max() < 1e-2
    cos_to, _ = rotary(copy.deepcopy(fp32).to(torch.bfloat16))  # what the teacher's placement did before
    assert (cos_to - cos32).abs().max() > 0.5
