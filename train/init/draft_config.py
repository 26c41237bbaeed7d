"""The draft's DSparkConfig from the run's `draft` keys, the target and the chosen mask token."""

from __future__ import annotations

import dataclasses

from common.config import DSparkConfig
from train.errors import SetupError
from train.init.mask_token import MaskTokenError, choose_mask_token
from train.schema import DraftCfg

# DraftCfg keys the mask choice resolves (train/init/mask_token.py); the others copy to DSparkConfig
MASK_KEYS = ("mask_token", "mask_token_id")


def draft_config(dcfg, target_model, tokenizer, target_path: str, mask=None) -> DSparkConfig:
    """The draft's DSparkConfig. `mask`: the `MaskToken` from `choose_mask_token` (which checks
    the training data); without it one is chosen from the tokenizer alone."""
    if mask is None:
        vocab = target_model.config.get_text_config().vocab_size
        try:
            mask = choose_mask_token(dcfg, tokenizer, vocab)
        except MaskTokenError as e:
            raise SetupError(str(e)) from None
    mask_id = mask.id
    choices = {
        f.name: dcfg[f.name] for f in dataclasses.fields(DraftCfg) if f.name not in MASK_KEYS
    }
    choices["target_layer_ids"] = (
        list(choices["target_layer_ids"]) if choices["target_layer_ids"] is not None else None
    )
    hf = target_model.config.get_text_config().to_dict()
    hf["_name_or_path"] = target_path
    return DSparkConfig.from_target(hf, mask_token_id=int(mask_id), **choices)


def mask_token_for(dcfg, target_model, tokenizer, train_ds):
    """Choose (or check) the mask token against the training rows, print the choice and why."""
    vocab = target_model.config.get_text_config().vocab_size
    try:
        mask = choose_mask_token(dcfg, tokenizer, vocab, train_ds)
    except MaskTokenError as e:
        raise SetupError(str(e)) from None
    print(f"[distill] mask token: {mask.describe()}")
    return mask
