"""The small training run that tests/training/test_multiprocess.py runs on 1 and 2 processes (as a script under
`accelerate launch`), and that tests/training/test_fsdp.py compares with FSDP2: a plain Llama on the LM objective
or an LRC student with the `lrc` recipe, its trainable weights and summary saved."""

from __future__ import annotations

import json
from pathlib import Path

STEPS, BATCH, MICRO = 12, 8, 2


def run_training(out: Path, kind: str) -> None:
    """kind "lm": a plain Llama on the LM objective; "clone": an LRC student (core arm) with
    the `lrc` recipe, whose frozen teacher each process holds unwrapped; "clone-divided": the
    same, each process building its share of the student's weights (``divide_weight_build``)."""
    from safetensors.torch import save_file

    from lrc.io.provenance import is_main_process
    from lrc.training.loop import TrainArgs, train
    from tests.helpers import SEQ, RandomTokens, tiny_llama

    if kind == "lm":
        from lrc.method.objectives import LMObjective

        model = tiny_llama()
        objective = LMObjective(model)
    else:
        from lrc.method.clone import CloneObjective, RecipeArgs
        from lrc.method.reach import apply_arm
        from lrc.method.student import build_student
        from tests.helpers import make_teacher

        teacher = make_teacher("llama-tied")
        model = build_student(teacher, 16, seed=0)
        apply_arm(model, teacher, "core")
        objective = CloneObjective(teacher, model, RecipeArgs(temperature=2.0))
    args = TrainArgs(tokens=STEPS * BATCH * SEQ, batch_size=BATCH, micro_batch_size=MICRO, lr=3e-3, warmup=0.1,
                     log_every=1, checkpoint_every=4, threads=1, progress=False,
                     divide_weight_build=kind == "clone-divided")
    summary = train(objective, model, RandomTokens(rows=40), args, out)
    if is_main_process():
        out.mkdir(parents=True, exist_ok=True)  # train() writes only into its checkpoint directory
        save_file({n: p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad},
                  str(out / "weights.safetensors"))
        (out / "summary.json").write_text(json.dumps(summary))
