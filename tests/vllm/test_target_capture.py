"""Layer-id convention end to end: the target hidden states vLLM captures for the draft are the ones
our trainer captures (`common.target.TargetCapture`).

vLLM side: its own Qwen3 target (`get_model`) runs a prefill on CPU (causal CPU_ATTN) with the
aux-hidden-state layers its DSpark runner derives from our draft config
(`get_eagle3_aux_layers_from_config`, = target_layer_ids + 1); ours: forward hooks on the HF
model's decoder layers `target_layer_ids`. Then both feed the draft's fc
(`combine_hidden_states`). Float32, atol = rtol = 1e-4 (CPU_ATTN vs HF sdpa).
"""

from __future__ import annotations

import pytest
import torch

from common.target import TargetCapture
from tests.tiny import write_draft
from tests.vllm import harness as H

pytestmark = pytest.mark.vllm

ATOL = RTOL = 1e-4


@torch.no_grad()
def test_vllm_aux_hidden_states_are_ours(random_target, vllm_workdir):
    from transformers import AutoModelForCausalLM

    path, ours = write_draft(random_target, vllm_workdir / "capture", embed_from_target=True)
    cfg = ours.config
    vc = H.engine_config(
        random_target,
        {
            "method": "dspark",
            "model": str(path),
            "num_speculative_tokens": cfg.num_speculative_tokens,
        },
    )
    target, draft = H.load_target_and_draft(vc)
    ids = torch.randint(4, cfg.vocab_size, (41,), generator=torch.Generator().manual_seed(5))
    aux_vllm = H.target_aux_hidden_states(target, vc, ids)
    assert len(aux_vllm) == len(cfg.target_layer_ids)

    hf = AutoModelForCausalLM.from_pretrained(random_target, dtype=torch.float32).eval()
    cap = TargetCapture(hf, cfg.target_layer_ids)(ids.unsqueeze(0))
    ours_aux = cap.aux[0]  # [T, L*H_t], ascending layer order
    torch.testing.assert_close(torch.cat(aux_vllm, -1), ours_aux, atol=ATOL, rtol=RTOL)

    # The off-by-one convention (HF hidden_states[i] = output of layer i-1) is NOT what vLLM feeds.
    hs = hf(ids.unsqueeze(0), output_hidden_states=True).hidden_states
    wrong = torch.cat([hs[i][0] for i in cfg.target_layer_ids], -1)
    assert not torch.allclose(torch.cat(aux_vllm, -1), wrong, atol=1e-2)

    # What the draft receives: fc over the concatenation, identical on both sides.
    torch.testing.assert_close(
        draft.combine_hidden_states(torch.cat(aux_vllm, -1)),
        ours.fc(ours_aux),
        atol=ATOL,
        rtol=RTOL,
    )
