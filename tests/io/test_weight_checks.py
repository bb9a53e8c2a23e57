"""No weight is made up (issue 28 item 2): every weight file read is checked (lrc.io.checks).

Configs state their sizes, every needed tensor is stored at its shape, every stored tensor is floating point
and finite, and bases are orthonormal; each refusal is an LRCError naming the file and the key or tensor, and
a valid checkpoint loads exactly as before."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from lrc.cli import main as lrc_main
from lrc.errors import LRCError
from lrc.io.hf import load_causal_lm, load_teacher
from lrc.method.spectral import BASES_FILE, compute_bases, load_bases, save_bases
from lrc.method.student import STATE_FILE, build_student, load_lrc_state, save_lrc_state
from tests.helpers import make_teacher

R = 16
WEIGHTS = "model.safetensors"
UP = "model.layers.1.mlp.up_proj.weight"


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """A saved untied llama teacher and a tied qwen2 one, the first one's bases and a `confined` LRC state."""
    from lrc.method.reach import apply_arm

    root = tmp_path_factory.mktemp("checks")
    teacher = make_teacher("llama-untied")
    teacher.save_pretrained(root / "teacher")
    make_teacher("qwen2-tied").save_pretrained(root / "qwen2")
    bases = compute_bases(teacher)
    save_bases(bases, root / "svd")
    student = build_student(teacher, R)
    apply_arm(student, teacher, "confined", bases=bases)
    save_lrc_state(student, root / "state", tokens=0)
    return root


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_tensors(file: Path, edit) -> None:
    """Rewrite the safetensors ``file`` with ``edit(tensors)`` applied (in place on the dict)."""
    tensors = load_file(str(file))
    edit(tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(file), metadata={"format": "pt"})


def _edited_teacher(world: Path, tmp_path: Path, edit, name: str = "teacher") -> Path:
    d = _copy(world / name, tmp_path / f"edited-{name}")
    _edit_tensors(d / WEIGHTS, edit)
    return d


def _fails(argv: list[str], capsys, *culprits: str) -> str:
    capsys.readouterr()
    assert lrc_main(argv) == 2
    err = capsys.readouterr().err
    assert "\nerror: " in "\n" + err and "Traceback" not in err, err
    for culprit in culprits:
        assert culprit in err, (culprit, err)
    return err


# ---------------------------------------------------------------- configs


@pytest.mark.parametrize("key", ["num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                                 "vocab_size"])
def test_config_without_a_required_key_is_refused_naming_file_and_key(world, tmp_path, key):
    d = _copy(world / "teacher", tmp_path / "teacher")
    config = json.loads((d / "config.json").read_text())
    del config[key]
    (d / "config.json").write_text(json.dumps(config))
    # Old code: transformers' default (32 layers, 30 of them random; hidden 4096: a shape error naming nothing).
    with pytest.raises(LRCError, match=f"{d / 'config.json'}.*{key}"):
        load_teacher(d)
    with pytest.raises(LRCError, match=key):
        load_causal_lm(d, dtype=torch.float32, role="--merged")


def test_config_without_layers_is_refused_by_the_commands_and_the_planner(world, tmp_path, capsys):
    from lrc.io.hf import load_model_config

    d = _copy(world / "teacher", tmp_path / "teacher")
    config = json.loads((d / "config.json").read_text())
    del config["num_hidden_layers"]
    (d / "config.json").write_text(json.dumps(config))
    _fails(["svd", "--teacher", str(d), "--out", str(tmp_path / "svd")], capsys, str(d / "config.json"),
           "num_hidden_layers")
    with pytest.raises(LRCError, match="num_hidden_layers"):  # `lrc plan`'s teacher config
        load_model_config(d / "config.json")
    config["num_hidden_layers"] = 0
    (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(LRCError, match="num_hidden_layers must be a positive integer"):
        load_teacher(d)


# ---------------------------------------------------------------- teacher and model weights


@pytest.mark.parametrize("name", ["teacher", "qwen2"])
def test_a_tensor_missing_from_the_weights_is_refused_not_made_up(world, tmp_path, name):
    d = _edited_teacher(world, tmp_path, lambda t: t.pop(UP), name)
    with pytest.raises(LRCError, match=f"missing.*{UP}.*randomly initialised"):
        load_teacher(d)


def test_an_untied_head_missing_is_refused(world, tmp_path):
    d = _edited_teacher(world, tmp_path, lambda t: t.pop("lm_head.weight"))
    with pytest.raises(LRCError, match="lm_head.weight"):
        load_causal_lm(d, dtype=torch.float32, role="--merged")


def test_an_int32_tensor_is_refused_naming_file_and_tensor(world, tmp_path, capsys):
    def to_int(t):
        t[UP] = (t[UP] * 100).to(torch.int32)

    d = _edited_teacher(world, tmp_path, to_int)
    with pytest.raises(LRCError, match=f"{d / WEIGHTS}.*{UP}.*I32"):
        load_teacher(d)
    _fails(["svd", "--teacher", str(d), "--out", str(tmp_path / "svd")], capsys, str(d / WEIGHTS), UP)


def test_a_misshapen_or_unknown_tensor_is_refused_naming_it(world, tmp_path):
    d = _edited_teacher(world, tmp_path, lambda t: t.update({UP: t[UP][:, :16]}))
    with pytest.raises(LRCError, match=f"{UP}.*shape"):  # old code: a RuntimeError naming no tensor
        load_teacher(d)
    # A tensor the config's model lacks (here: a third layer; old code ignored it).
    extra = "model.layers.2.mlp.up_proj.weight"
    d = _copy(world / "teacher", tmp_path / "extra")
    _edit_tensors(d / WEIGHTS, lambda t: t.update({extra: t[UP].clone()}))
    with pytest.raises(LRCError, match=extra):
        load_teacher(d)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_and_inf_in_a_weight_are_refused_naming_file_and_tensor(world, tmp_path, capsys, bad):
    def poison(t):
        t[UP][3, 5] = bad

    d = _edited_teacher(world, tmp_path, poison)
    with pytest.raises(LRCError, match=f"{d / WEIGHTS}.*{UP}.*non-finite"):
        load_teacher(d, dtype=torch.bfloat16)
    # Old code: `lrc svd` ended in a LinAlgError naming no file or tensor.
    _fails(["svd", "--teacher", str(d), "--out", str(tmp_path / "svd")], capsys, str(d / WEIGHTS), UP)


def test_a_pickled_int_tensor_is_refused_too(world, tmp_path):
    d = tmp_path / "pickled"
    d.mkdir()
    shutil.copy(world / "teacher" / "config.json", d / "config.json")
    state = load_file(str(world / "teacher" / WEIGHTS))
    state[UP] = state[UP].to(torch.int32)
    torch.save(state, d / "pytorch_model.bin")
    with pytest.raises(LRCError, match=f"{UP}.*int32"):
        load_teacher(d, allow_pickle=True)


@pytest.mark.parametrize("name", ["teacher", "qwen2"])
def test_a_valid_checkpoint_loads_bitwise_as_before(world, name):
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(world / name, dtype=torch.float32).state_dict()
    loaded = load_teacher(world / name).state_dict()
    assert plain.keys() == loaded.keys()
    assert all(torch.equal(plain[k], loaded[k]) for k in plain)
    stored = load_file(str(world / name / WEIGHTS))
    assert all(torch.equal(stored[k], loaded[k]) for k in stored)


# ---------------------------------------------------------------- LRC states


def _state_fails(world: Path, tmp_path: Path, edit, *match: str) -> None:
    state = _copy(world / "state", tmp_path / "state")
    _edit_tensors(state / STATE_FILE, edit)
    teacher = load_teacher(world / "teacher")
    with pytest.raises(LRCError) as raised:
        load_lrc_state(state, teacher, load_bases(world / "svd", teacher))
    for culprit in match:
        assert culprit in str(raised.value), (culprit, str(raised.value))


FACTOR = "model.layers.0.self_attn.q_proj.parametrizations.weight.original"


def test_a_state_with_a_missing_tensor_is_refused(world, tmp_path):
    # (Refused before this change too, by load_lrc_state's missing-key check.)
    _state_fails(world, tmp_path, lambda t: t.pop(FACTOR), FACTOR, "missing")


def test_a_state_with_a_misshapen_tensor_is_refused_naming_it(world, tmp_path):
    # Old code: a RuntimeError from load_state_dict naming no file.
    _state_fails(world, tmp_path, lambda t: t.update({FACTOR: t[FACTOR][:, :8]}), FACTOR, STATE_FILE, "[32, 8]")


def test_a_state_with_an_int_tensor_is_refused_naming_it(world, tmp_path):
    # Old code: cast to float32 and used.
    _state_fails(world, tmp_path, lambda t: t.update({FACTOR: (t[FACTOR] * 50).to(torch.int32)}),
                 FACTOR, STATE_FILE, "I32")


def test_a_state_with_nan_or_an_unknown_tensor_is_refused_naming_it(world, tmp_path):
    def poison(t):
        t[FACTOR][0, 0] = float("nan")

    _state_fails(world, tmp_path, poison, FACTOR, STATE_FILE, "non-finite")
    shutil.rmtree(tmp_path / "state")
    _state_fails(world, tmp_path, lambda t: t.update({"model.extra": torch.zeros(2)}), "model.extra", STATE_FILE)


def test_a_valid_state_loads_bitwise_as_before(world):
    teacher = load_teacher(world / "teacher")
    student = load_lrc_state(world / "state", teacher, load_bases(world / "svd", teacher))
    state = student.state_dict()
    stored = load_file(str(world / "state" / STATE_FILE))
    assert all(torch.equal(stored[k], state[k]) for k in stored)


# ---------------------------------------------------------------- bases


def _bases_fail(world: Path, tmp_path: Path, edit, *match: str) -> None:
    bases = _copy(world / "svd", tmp_path / "svd")
    _edit_tensors(bases / BASES_FILE, edit)
    with pytest.raises(LRCError) as raised:
        load_bases(bases)
    for culprit in (str(bases / BASES_FILE), *match):
        assert culprit in str(raised.value), (culprit, str(raised.value))


def test_scaled_bases_are_refused_naming_the_matrix(world, tmp_path):
    _bases_fail(world, tmp_path, lambda t: t.update({"layers.1.up.U": t["layers.1.up.U"] * 1.01}),
                "layers.1.up.U", "not orthonormal")


@pytest.mark.parametrize("unit", [False, True])
def test_a_basis_column_swapped_for_noise_is_refused(world, tmp_path, unit):
    def swap(t):
        noise = torch.randn(96, generator=torch.Generator().manual_seed(3))
        t["layers.0.down.U"][:, 7] = noise / noise.norm() if unit else noise * 0.1

    _bases_fail(world, tmp_path, swap, "layers.0.down.U", "not orthonormal")


def test_a_non_orthonormal_embedding_basis_is_refused(world, tmp_path):
    _bases_fail(world, tmp_path, lambda t: t.update({"embed.V": t["embed.V"] * 0.99}), "embed.V")


def test_int_misshapen_missing_or_nan_bases_are_refused(world, tmp_path):
    _bases_fail(world, tmp_path, lambda t: t.update({"layers.0.gate.U": t["layers.0.gate.U"].to(torch.int32)}),
                "layers.0.gate.U", "I32")
    shutil.rmtree(tmp_path / "svd")
    _bases_fail(world, tmp_path, lambda t: t.update({"layers.0.gate.S": t["layers.0.gate.S"][:5]}),
                "layers.0.gate.S", "shape")
    shutil.rmtree(tmp_path / "svd")
    _bases_fail(world, tmp_path, lambda t: t.pop("layers.1.gate.U"), "layers.1.gate.U")
    shutil.rmtree(tmp_path / "svd")

    def poison(t):
        t["layers.0.up.S"][2] = float("nan")

    _bases_fail(world, tmp_path, poison, "layers.0.up.S", "non-finite")


def test_bad_bases_are_refused_by_merge(world, tmp_path, capsys):
    bases = _copy(world / "svd", tmp_path / "svd")
    _edit_tensors(bases / BASES_FILE, lambda t: t.update({"layers.1.up.U": t["layers.1.up.U"] * 1.01}))
    _fails(["merge", "--state", str(world / "state"), "--teacher", str(world / "teacher"), "--bases", str(bases),
            "--out", str(tmp_path / "merged")], capsys, str(bases / BASES_FILE), "layers.1.up.U")
    assert not (tmp_path / "merged").exists()


def test_valid_bases_load_bitwise_as_stored(world):
    bases = load_bases(world / "svd")
    stored = load_file(str(world / "svd" / BASES_FILE))
    assert all(torch.equal(stored[f"layers.{k}.U"], u) for k, u in bases.U.items())
    assert torch.equal(stored["embed.V"], bases.embed_V)


def test_the_probed_orthonormality_check_of_large_bases(world):
    """Large bases are checked through their column norms and seeded probes (lrc.io.checks): forced here."""
    from lrc.io.checks import orthonormality_error

    u = load_file(str(world / "svd" / BASES_FILE))["layers.0.gate.U"]
    assert orthonormality_error(u, exact_limit=0) < 1e-5
    assert orthonormality_error(u * 1.01, exact_limit=0) > 1e-3
    noisy = u.clone()
    noise = torch.randn(96, generator=torch.Generator().manual_seed(3))
    noisy[:, 7] = noise / noise.norm()
    assert orthonormality_error(noisy, exact_limit=0) > 1e-3
    exact = orthonormality_error(noisy)
    assert exact > 1e-3 and abs(orthonormality_error(u) - 0) < 1e-5


def test_the_finiteness_check_is_exact_when_a_finite_sum_overflows():
    """check_finite sums each tensor (NaN/Inf propagate); an fp16 sum that overflows takes the exact pass."""
    from lrc.io.checks import check_finite

    big = torch.full((100_000,), 60_000.0, dtype=torch.float16)
    check_finite([("w", big)], {}, "teacher", "model.safetensors")
    big[5] = float("-inf")
    with pytest.raises(LRCError, match="model.safetensors: tensor 'w' has 1 non-finite"):
        check_finite([("w", big)], {}, "teacher", "model.safetensors")
