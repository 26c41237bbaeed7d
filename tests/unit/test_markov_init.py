"""train/init/markov_init.py: the Markov head's previous-token rows from the target embedding."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from tests.dist.tiny import tiny_model
from tests.integration.test_distill import fast
from train.distill import main
from train.init.markov_init import markov_rows_from_embedding


def test_rows_are_the_embeddings_principal_components_at_the_noises_scale():
    torch.manual_seed(0)
    draft = tiny_model()
    v, r = draft.markov_head.markov_w1.weight.shape
    h = 2 * r
    # an embedding of rank r/2 plus a little noise: its top r/2 directions hold nearly all of it
    embed = torch.randn(v, r // 2) @ torch.randn(r // 2, h) + 0.01 * torch.randn(v, h)
    embed[1] = embed[0]  # two tokens the target embeds alike
    share = markov_rows_from_embedding(draft, embed)
    w1 = draft.markov_head.markov_w1.weight.detach().double()
    assert share > 0.99
    assert w1.std().item() == pytest.approx(0.02, rel=1e-6)
    torch.testing.assert_close(w1[1], w1[0])
    # the rows are a linear image of the centred embedding: a least-squares map back fits exactly
    e = (embed - embed.mean(0)).double()
    fit = torch.linalg.lstsq(e, w1).solution
    torch.testing.assert_close(e @ fit, w1, atol=1e-9, rtol=0)
    # columns are ordered by variance, like principal components
    var = w1.var(0)
    assert torch.all(var[:-1] >= var[1:] - 1e-12)


def test_a_rank_past_the_hidden_size_keeps_the_rest_of_its_noise():
    draft = tiny_model()
    w1 = draft.markov_head.markov_w1.weight
    v, r = w1.shape
    before = w1.detach().clone()
    markov_rows_from_embedding(draft, torch.randn(v, r // 4))
    assert not torch.equal(w1[:, : r // 4], before[:, : r // 4])
    assert torch.equal(w1[:, r // 4 :], before[:, r // 4 :])
    with pytest.raises(ValueError, match="rows"):
        markov_rows_from_embedding(draft, torch.randn(v + 1, 8))


def test_a_run_starts_from_them_and_records_it(target, tmp_path, capsys):
    assert main(fast(target, tmp_path / "run", "init_markov_from_embedding=true")) == 0
    assert "Markov head rows from the target embedding" in capsys.readouterr().out
    assert "init_markov_from_embedding" in (tmp_path / "run" / "final" / "README.md").read_text()
    w1 = [
        v
        for k, v in load_file(tmp_path / "run" / "final" / "model.safetensors").items()
        if k.endswith("markov_w1.weight")
    ]
    assert len(w1) == 1


@pytest.mark.parametrize(
    "extra",
    [["draft.markov_rank=0", "draft.enable_confidence_head=false"], ["init_from=ANY"]],
)
def test_it_is_refused_without_a_head_or_beside_init_from(target, tmp_path, capsys, extra):
    extra = [e.replace("ANY", str(tmp_path)) for e in extra]
    args = fast(target, tmp_path / "run", "init_markov_from_embedding=true", *extra)
    assert main(args) == 2
    assert "init_markov_from_embedding needs a Markov head" in capsys.readouterr().err
