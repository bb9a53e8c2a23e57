"""The teacher's own tensor as the LRC student's weights read it: never copied, never saved."""

from __future__ import annotations

import torch
from torch import nn

from lrc.errors import LRCError


class TeacherTensor:
    """The teacher module's own tensor ``module.<name>``, read where it lives, never copied.

    Not a buffer and not a submodule: the student's ``.to()``, ``state_dict``, DDP and FSDP
    never see it, so the teacher's weights are held once per process, in the teacher's
    dtype and on its device (a bf16 teacher on a GPU: bf16, which autocast then uses as it
    is, with nothing cast or saved per forward). Read at every use, so it follows the
    teacher wherever it is moved or cast (:func:`lrc.training.loop.place_teacher`). A deep copy of
    the student shares it (the teacher is frozen: METHOD.md §1, lrc.io.hf).
    """

    __slots__ = ("module", "name")

    def __init__(self, module: nn.Module, name: str = "weight"):
        self.module, self.name = module, name

    def get(self) -> torch.Tensor:
        return getattr(self.module, self.name)

    def __deepcopy__(self, memo):
        return self


def teacher_operand(handle: TeacherTensor, factor: torch.Tensor) -> torch.Tensor:
    """The teacher tensor as the product with ``factor`` takes it: itself, or (a teacher in
    another dtype outside autocast, e.g. a bf16 teacher and an fp32 student) cast per use."""
    t = handle.get()
    if t.device != factor.device:
        raise LRCError(f"the LRC student reads its teacher's {handle.name} on {t.device}, its factors are "
                       f"on {factor.device}: place the teacher on the student's device")
    if t.dtype != factor.dtype and not torch.is_autocast_enabled(factor.device.type):
        return t.to(factor.dtype)
    return t


class ReadsTeacher(nn.Module):
    """A parametrisation module that reads one teacher tensor (``teacher_tensor``, ``frozen``)."""

    def __init__(self, teacher_module: nn.Module, name: str = "weight"):
        super().__init__()
        self.teacher_tensor = TeacherTensor(teacher_module, name)

    @property
    def frozen(self) -> torch.Tensor:
        """The teacher tensor T (the teacher's own, see :class:`TeacherTensor`)."""
        return self.teacher_tensor.get()
