"""Step-0 clone-term magnitudes per layer, and the teacher's activation scale, on a real teacher.

    python scripts/clone_term_scale.py --teacher DIR --data TOKDIR --r 288 [--batches 4]
    python scripts/clone_term_scale.py --teacher DIR --data VALIDDIR --heldout STATE_DIR...

Prints, per layer: each term's MSE and its target's mean square (averaged over the batches)
for a fresh warm-start student (normal init, the `lrc warmstart` default), and the
teacher's residual stream after the layer (mean square, max |h|). With ``--heldout``: the
held-out CE and KL (T = 1, per token) of each LRC state directory over all rows of --data.
docs/real-teacher.md.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch

from lrc.io.hf import load_teacher
from lrc.io.tokens import open_token_data
from lrc.method.clone import CLONE_TERMS, CloneObjective, RecipeArgs
from lrc.method.losses import kl_divergence, next_token_ce
from lrc.method.student import build_student, load_lrc_state


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--teacher", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--r", type=int, default=288)
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--init", default="normal")
    ap.add_argument("--heldout", nargs="*", default=None)
    a = ap.parse_args()
    torch.manual_seed(0)
    teacher = load_teacher(a.teacher)
    if a.heldout is not None:
        return heldout(teacher, open_token_data(a.data), a.heldout)
    student = build_student(teacher, a.r, init=a.init, seed=0)
    data = open_token_data(a.data)
    obj = CloneObjective(teacher, student, RecipeArgs())
    sums, totals = defaultdict(float), defaultdict(float)
    hid_ms, hid_max = defaultdict(float), defaultdict(float)
    for b in range(a.batches):
        ids = torch.stack([torch.as_tensor(data[b * a.micro_batch + j]["input_ids"]).long()
                           for j in range(a.micro_batch)])
        with torch.no_grad():
            total, terms = obj.loss({"input_ids": ids})
            hs = teacher(input_ids=ids, output_hidden_states=True).hidden_states
        for k, v in terms.items():
            totals[k] += v.item() / a.batches
        lt = obj.layer_terms()
        for key in lt["mse"]:
            sums[("mse",) + key] += lt["mse"][key].item() / a.batches
            sums[("ms",) + key] += lt["target_ms"][key].item() / a.batches
        for i, h in enumerate(hs[1:]):
            hid_ms[i] += h.float().square().mean().item() / a.batches
            hid_max[i] = max(hid_max[i], h.abs().max().item())
    print("totals (summed over layers): " + ", ".join(f"{k} {v:.4g}" for k, v in totals.items()))
    print("| layer | " + " | ".join(f"{t} MSE / ms(t)" for t in CLONE_TERMS) + " | h ms | max abs h |")
    print("|---|" + "---|" * (len(CLONE_TERMS) + 2))
    for i in range(teacher.config.num_hidden_layers):
        cells = [f"{sums[('mse', i, t)]:.3g} / {sums[('ms', i, t)]:.3g}" for t in CLONE_TERMS]
        print(f"| {i} | " + " | ".join(cells) + f" | {hid_ms[i]:.3g} | {hid_max[i]:.4g} |")


def heldout(teacher, data, states) -> None:
    ids = torch.stack([torch.as_tensor(data[i]["input_ids"]).long() for i in range(len(data))])
    with torch.no_grad():
        t_logits = teacher(input_ids=ids).logits
        print(f"teacher: held-out CE {next_token_ce(t_logits, ids).item():.3f} over {ids.numel()} tokens")
        for state in states:
            logits = load_lrc_state(state, teacher)(input_ids=ids).logits
            kl = kl_divergence(t_logits, logits, 1.0, reduction="token")
            print(f"{state}: held-out CE {next_token_ce(logits, ids).item():.3f}, KL {kl.item():.3f}")


if __name__ == "__main__":
    main()
