"""`DistillObjective`: the draft plus its loss as one `nn.Module`, so DDP/FSDP wrap a single
forward that touches every trainable parameter (the loss reads `lm_head`/`markov_w2` and the
confidence head directly, which a wrapper only sees if it happens inside its forward)."""

from __future__ import annotations

import torch
from torch import nn

from common.model import DSparkDraftModel
from train.loop.loss import BlockTargets, distill_loss, loss_weights
from train.loop.phases import phase


class DistillObjective(nn.Module):
    def __init__(self, draft: DSparkDraftModel, loss_cfg, compile_loss: bool = False):
        super().__init__()
        self.draft = draft
        self.weights = loss_weights(loss_cfg)
        self.chunk_tokens = loss_cfg.chunk_tokens
        self.confidence_detach = loss_cfg.confidence_detach
        self.share_teacher = loss_cfg.share_teacher
        # trainer.compile_loss (train.loop.vocab_loss.compiled_fused_chunk)
        self.compile_loss = compile_loss

    def forward(
        self,
        aux: torch.Tensor,  # [N, T, L*Ht] captured target layers
        teacher_final: torch.Tensor,  # [N, T, Ht]
        teacher_lm_head: torch.Tensor,  # [V, Ht]
        batch: dict[str, torch.Tensor],  # input_ids, position_ids, doc_ids [N, T]
        anchors: torch.Tensor,  # [N, A]
        anchor_valid: torch.Tensor,  # [N, A]
        targets: BlockTargets,
        dens: dict[str, torch.Tensor],
    ):
        with phase("draft_forward"):
            fo = self.draft.forward_train(
                aux,
                batch["input_ids"],
                anchors,
                anchor_valid,
                position_ids=batch.get("position_ids"),
                doc_ids=batch.get("doc_ids"),
            )
        with phase("loss_forward"):
            return distill_loss(
                self.draft,
                fo,
                targets,
                teacher_final,
                teacher_lm_head,
                dens,
                weights=self.weights,
                chunk_tokens=self.chunk_tokens,
                confidence_detach=self.confidence_detach,
                compiled=self.compile_loss,
                share_teacher=self.share_teacher,
            )


@torch.no_grad()
def init_draft_weights(draft: DSparkDraftModel, std: float = 0.02) -> None:
    """HF-style init for trainable parts; the Markov output starts at zero so an untrained
    DSpark draft begins exactly as its DFlash backbone, and the confidence head at c = 0.5."""
    for name, module in draft.named_modules():
        if name in ("lm_head", "embed_tokens"):
            continue
        if isinstance(module, nn.Linear):
            module.weight.normal_(0.0, std)
            if module.bias is not None:
                module.bias.zero_()
    if draft.markov_head is not None:
        draft.markov_head.markov_w1.weight.normal_(0.0, std)
        draft.markov_head.markov_w2.weight.zero_()
    if draft.confidence_head is not None:
        draft.confidence_head.proj.weight.zero_()
        draft.confidence_head.proj.bias.zero_()
