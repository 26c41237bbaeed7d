"""The DSpark draft model (backbone, Markov head, confidence head, vocab map buffers)."""

from common.model.draft import DSparkDraftModel, TrainForward, block_label_positions
from common.model.masks import inference_block_mask, training_block_mask

__all__ = [
    "DSparkDraftModel",
    "TrainForward",
    "block_label_positions",
    "inference_block_mask",
    "training_block_mask",
]
