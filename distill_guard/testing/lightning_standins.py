"""A stand-in LightningModule for the docs' examples and the tests: distillation of a student from
a teacher with :func:`~distill_guard.losses.distill_loss`, over a loader of token batches (the
models and the loader: :mod:`distill_guard.testing.standins`). Needs ``lightning``
(``pip install 'distill_guard[lightning]'``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from distill_guard.extras import needed
from distill_guard.losses import distill_loss

with needed("the stand-in LightningModule (distill_guard.testing.lightning_standins)", "lightning"):
    import lightning.pytorch as pl


class DistillModule(pl.LightningModule):
    """``self.teacher`` (frozen, in eval mode) scores each batch of ``loader`` without gradients;
    the loss is ``distill_loss(student logits, teacher logits, mask=attention_mask).loss``, logged
    as ``train/loss`` every step; AdamW at ``lr`` on the student."""

    def __init__(
        self,
        teacher: torch.nn.Module,
        student: torch.nn.Module,
        loader: Iterable[dict[str, torch.Tensor]],
        lr: float = 1e-3,
    ) -> None:
        super().__init__()
        self.teacher = teacher.eval().requires_grad_(False)
        self.student = student
        self.loader, self.lr = loader, lr

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        with torch.no_grad():
            t_logits = self.teacher(**batch).logits
        loss = distill_loss(self.student(**batch).logits, t_logits, mask=batch["attention_mask"])
        self.log("train/loss", loss.loss, on_step=True, prog_bar=False)
        return loss.loss

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.student.parameters(), lr=self.lr)

    def train_dataloader(self) -> Any:
        # batch_size=None: the loader's batches as they are (a bare list would be several loaders)
        return torch.utils.data.DataLoader(self.loader, batch_size=None)
