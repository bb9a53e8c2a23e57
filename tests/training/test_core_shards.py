"""Under DDP each process holds only the bases of the matrices whose basis changes it runs.

Two gloo processes run :class:`lrc.training.optim.CoordinateAdamW` on a `core` student with the same
(synthetic, identical) gradients: the maps of the weights another process owns are
released, the first step's coordinates and every update come from the owner, and the
weights and optimiser state are bitwise those of an optimiser on the same process that
holds every map and computes everything itself (what every process did before).
"""

from __future__ import annotations

import copy
import io

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

STEPS = 3


def _student(arm: str, core_impl: str):
    from lrc.method.reach import apply_arm
    from lrc.method.student import build_student
    from tests.helpers import make_teacher

    torch.manual_seed(0)
    teacher = make_teacher("llama-tied")
    student = build_student(teacher, 16, seed=0)
    apply_arm(student, teacher, arm, core_impl=core_impl)
    return student


def _optimizer(student):
    from lrc.training.optim import CoordinateAdamW, coordinate_maps

    params = [p for p in student.parameters() if p.requires_grad]
    return CoordinateAdamW([{"params": params, "weight_decay": 0.1}], coordinates=coordinate_maps(student), lr=1e-2)


def _train(student, optimizer, clip: float = 0.0) -> list[float]:
    params = [p for p in student.parameters() if p.requires_grad]
    norms = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(step)
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        if clip:  # the coordinates' norm, summed over the maps' owners (the loop's clipping for core)
            norms.append(optimizer.clip_grad_norm_(params, clip).item())
        optimizer.step()
    return norms


def _worker(rank: int, init: str, arm: str, core_impl: str, clip: float, results) -> None:
    from lrc.names import COORDINATES_ATTR

    torch.set_num_threads(1)
    student = _student(arm, core_impl)
    local = copy.deepcopy(student)
    reference = _optimizer(local)  # before the process group: it holds every map, computes every value itself
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        shared = _optimizer(student)
        maps = [getattr(m, COORDINATES_ATTR) for m in student.modules()
                if getattr(m, COORDINATES_ATTR, None) is not None]
        held = [not m.released for m in maps]
        norms = _train(local, reference, clip), _train(student, shared, clip)
        # Clipped, the norm is a sum of the owners' partial sums: the same up to rounding, not bitwise.
        same = (lambda a, b: torch.allclose(a, b, rtol=1e-5, atol=1e-7)) if clip else torch.equal
        same_w = all(same(a, b) for a, b in zip(student.parameters(), local.parameters()))
        same_q = all(same(shared.state[a]["coordinates"], reference.state[b]["coordinates"])
                     and same(shared.state[a]["exp_avg_sq"], reference.state[b]["exp_avg_sq"])
                     for a, b in zip(student.parameters(), local.parameters()) if "coordinates" in shared.state[a])
        same_norms = torch.allclose(torch.tensor(norms[0]), torch.tensor(norms[1]), rtol=1e-6)
        results[rank] = (held, same_w, same_q, shared.coordinate_share, same_norms and all(n > clip for n in norms[1]))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize(("arm", "core_impl", "clip"),
                         [("core", "optimizer", 0.0), ("randcomp", "optimizer", 0.0),
                          ("coreortho", "optimizer", 0.0), ("core", "optimizer", 1.0)])
def test_each_process_holds_its_share_and_the_steps_are_bitwise_unchanged(tmp_path, arm, core_impl, clip):
    results = mp.Manager().dict()
    mp.spawn(_worker, args=(f"file://{tmp_path / 'pg'}", arm, core_impl, clip, results), nprocs=2, join=True)
    for rank in (0, 1):
        held, same_w, same_q, share, clipped_alike = results[rank]
        assert held == [j % 2 == rank for j in range(len(held))]  # only its own maps' bases are kept
        assert share == {"maps": len(held), "this_process": len(held) // 2, "processes": 2}
        assert same_w and same_q
        assert clipped_alike or not clip  # the same norm as one process, and above the clip


def _sharded_worker(rank: int, init: str, arm: str, results) -> None:
    """ZeRO-1 (shard_states): each process steps and keeps the states of its share; the
    weights, the collected checkpoint and a resumed run are those of one process."""
    from lrc.training.optim import CoordinateAdamW, coordinate_maps

    torch.set_num_threads(1)
    student = _student(arm, "optimizer")
    local, resumed = copy.deepcopy(student), copy.deepcopy(student)
    reference = _optimizer(local)  # before the process group: one process, every state
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        def sharded(model):
            params = [p for p in model.parameters() if p.requires_grad]
            return CoordinateAdamW([{"params": params, "weight_decay": 0.1}], coordinates=coordinate_maps(model),
                                   shard_states=True, lr=1e-2)

        shared = sharded(student)
        _train(local, reference)
        _train(student, shared)
        same_w = all(torch.equal(a, b) for a, b in zip(student.parameters(), local.parameters()))
        held = sum(1 for p in student.parameters() if p.requires_grad and p in shared.state)
        saved, expected = shared.state_dict(), reference.state_dict()
        same_saved = rank != 0 or (saved["state"].keys() == expected["state"].keys() and all(
            torch.equal(saved["state"][i][k], expected["state"][i][k])
            for i in expected["state"] for k in expected["state"][i]))
        # a restart: fresh weights from the same checkpoint, every process loading the full state
        full = [None]
        if rank == 0:  # through bytes, as a file would (state_dict's own tensors are the live ones)
            buffer = io.BytesIO()
            torch.save(saved, buffer)
            full = [buffer.getvalue()]
        dist.broadcast_object_list(full, src=0)
        full = [torch.load(io.BytesIO(full[0]), weights_only=True)]
        for a, b in zip(resumed.parameters(), student.parameters()):
            a.data.copy_(b.data)
        again = sharded(resumed)
        again.load_state_dict(full[0])
        _train(student, shared)
        _train(resumed, again)
        same_resume = all(torch.equal(a, b) for a, b in zip(resumed.parameters(), student.parameters()))
        results[rank] = (same_w, same_saved, same_resume, held, shared.coordinate_share)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("arm", ["dense", "core"])
def test_sharded_states_are_divided_and_change_nothing(tmp_path, arm):
    results = mp.Manager().dict()
    mp.spawn(_sharded_worker, args=(f"file://{tmp_path / 'pg'}", arm, results), nprocs=2, join=True)
    shares = [results[rank][4] for rank in (0, 1)]
    total = shares[0]["state_params"]
    assert [s["state_params_this_process"] for s in shares] == [results[r][3] for r in (0, 1)]  # it holds what it owns
    assert sum(results[r][3] for r in (0, 1)) == total and min(results[r][3] for r in (0, 1)) > 0
    for rank in (0, 1):
        same_w, same_saved, same_resume, _, _ = results[rank]
        assert same_w, "the sharded steps moved the weights differently from one process"
        assert same_saved, "process 0's collected state is not the one-process state"
        assert same_resume, "a run resumed from the collected state diverged"


def test_a_released_map_is_refused():
    from lrc.errors import LRCError
    from lrc.names import COORDINATES_ATTR

    student = _student("core", "optimizer")
    cmap = next(getattr(m, COORDINATES_ATTR) for m in student.modules()
                if getattr(m, COORDINATES_ATTR, None) is not None)
    cmap.release()
    with pytest.raises(LRCError, match="released"):
        cmap.coordinates(torch.zeros(8, 8))
