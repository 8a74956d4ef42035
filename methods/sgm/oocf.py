"""Old output class freezing (SGM, Harun & Kanan 2024, Sec. 4).

The output rows (weight row and bias entry) of every class from an earlier session get no gradient.
``old_rows: decay`` (default) is the published code (yousuf907/SGM, partial_freeze.py
``freeze_linear_params``): only the gradient is masked, so AdamW's decoupled weight decay still shrinks
the old rows (by lr * weight_decay per update, ~1.5 % over a 600-update session at the paper's
settings). ``old_rows: frozen`` is the text's "freezing": the rows do not move at all.

How: at session start the old rows are snapshotted and a gradient hook on the head's weight and bias
zeroes their old entries (so backward leaves them exactly zero gradient); with ``old_rows: frozen``,
once the optimizer is built, a step post-hook on it copies the snapshot back after every step, which
undoes the decoupled decay (and anything else an optimizer might do to a zero-gradient row). Rows are frozen, not
removed: they still produce logits, and rehearsal still trains the body on old samples.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ...harness.data.stream import Session
from ..base import Modifier, StandardMethod
from ..configs import OOCFConfig

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle


class OldClassFreezing(Modifier):
    name = "oocf"
    summary = "Old output class freezing: rows of earlier classes get no gradient (weight decay: old_rows)."
    Config = OOCFConfig
    config: OOCFConfig

    def __init__(self, config=None) -> None:
        super().__init__(config)
        self.n_old = 0
        self._frozen: tuple[Tensor, Tensor] | None = None
        self._handles: list[RemovableHandle] = []

    def begin_session(self, method: StandardMethod, session: Session) -> None:
        self._release()
        fc = method.model.head.fc
        self.n_old = session.seen_classes - len(session.new_classes)  # rows of a full head past seen train
        n = self.n_old
        self._frozen = (fc.weight.detach()[:n].clone(), fc.bias.detach()[:n].clone())

        def zero_old(grad: Tensor) -> Tensor:
            grad = grad.clone()
            grad[:n] = 0
            return grad

        self._handles += [fc.weight.register_hook(zero_old), fc.bias.register_hook(zero_old)]

    def scheduler(self, method: StandardMethod, optimizer: torch.optim.Optimizer, total_steps: int | None):
        """Called once the session's optimizer exists: restore old rows after each of its steps."""
        if self.config.old_rows == "decay":
            return None
        fc = method.model.head.fc

        def restore(*_: object) -> None:  # the optimizer, its step's args and kwargs: unread
            if self._frozen is not None and self.n_old:
                with torch.no_grad():
                    fc.weight[: self.n_old] = self._frozen[0]
                    fc.bias[: self.n_old] = self._frozen[1]

        self._handles.append(optimizer.register_step_post_hook(restore))
        return None

    def end_session(self, method: StandardMethod, session: Session) -> None:
        self._release()

    def _release(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles, self._frozen = [], None
