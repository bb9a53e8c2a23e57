"""What the clone terms add to the tensors autograd saves for backward, in one LRC loss.

    python scripts/clone_term_memory.py TEACHER_CONFIG.json SEQ [R]

A random teacher of that config (lrc bench's), the `slice` student at R (default 1536), one
row of SEQ random tokens, fp32; the distinct storages saved for backward with all clone
terms and with none (docs/real-teacher.md, "Streamed clone terms: memory").
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import lrc
from lrc.commands.bench import load_bench_teacher
from lrc.method.clone import CloneObjective, RecipeArgs
from lrc.method.student import build_student


def saved_mib(objective, ids) -> float:
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        objective.loss({"input_ids": ids})
    return sum(seen.values()) / 2**20


def main() -> None:
    torch.set_num_threads(1)
    config, seq = Path(sys.argv[1]), int(sys.argv[2])
    r = int(sys.argv[3]) if len(sys.argv) > 3 else 1536
    teacher = load_bench_teacher(config, 0)
    student = build_student(teacher, r, seed=0)
    ids = torch.randint(0, teacher.config.vocab_size, (1, seq), generator=torch.Generator().manual_seed(0))
    for terms in (None, []):
        mib = saved_mib(CloneObjective(teacher, student, RecipeArgs(clone_terms=terms)), ids)
        print(lrc.__file__, "clone terms" if terms is None else "no clone terms", f"saved {mib:.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
