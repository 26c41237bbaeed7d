"""End-to-end losslessness: speculative decoding with the DSpark sampling stack (Markov walk ->
[adaptive verify lengths] -> rejection sampling) must generate sequences distributed exactly as
the target's own sampling.

Set-up: a tiny target vocab (6 ids), a toy target whose next-token logits depend on the last two
tokens, and a real tiny DSparkDraftModel (seeded, deliberately unlike the target) driven by
hidden states that depend on the anchor. S independent requests (own seeds) decode L tokens after
a one-token prompt over several speculative rounds; the empirical distribution of the V^L
sequences is compared with the exact one by a chi-square test (p > 1e-3). The same test must
reject (p < 1e-6) when the residual is replaced by p_t or when p_d is not the distribution the
draft sampled from.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from scipy import stats

import common.sampling.verify as verify_mod
from common.config import MARKOV_HEAD_TYPES
from common.sampling.adaptive import SPSTable, plan_verify_lengths
from common.sampling.draft_probs import DraftProbs
from common.sampling.markov_walk import markov_walk
from common.sampling.verify import rejection_verify
from tests.dist.tiny import single_thread, tiny_model  # noqa: F401

V, L, PROMPT = 6, 4, 2
GROUP = 8  # requests per scheduling batch for the adaptive planner


def target_table(seed: int = 0) -> torch.Tensor:
    """[V+1, V, V] logits by (second-last token or V for none, last token)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(V + 1, V, V, generator=g) * 1.5


def exact_distribution(table, temperature: float) -> torch.Tensor:
    """[V**L] probability of each continuation (base-V index, first token most significant)."""
    p = torch.zeros(V**L, dtype=torch.float64)
    for i, seq in enumerate(itertools.product(range(V), repeat=L)):
        prev2, prev1, prob = V, PROMPT, 1.0
        for x in seq:
            prob *= float(torch.softmax(table[prev2, prev1].double() / temperature, -1)[x])
            prev2, prev1 = prev1, x
        p[i] = prob
    return p


def speculative_decode(
    model, table, S, temperature, *, topk=None, sps=None, plan=None, corrupt=None
):
    """Generate L tokens for S requests; returns [S, L] token ids.

    sps: Algorithm 1's table; plan: any other planner, [GROUP, N] confidences -> [GROUP] lengths.

    corrupt: None, or "no_markov" to verify with the draft probabilities of the base logits
    alone (not the distribution the walk sampled from).
    """
    cfg = model.config
    N, H = cfg.num_speculative_tokens, cfg.hidden_size
    g = torch.Generator().manual_seed(123)
    h_table = torch.randn(V, N, H, generator=g)  # draft "backbone": hidden by anchor and slot
    temps = torch.full((S,), float(temperature))
    seeds = torch.arange(S) * 1_000_003 + 17
    toks = torch.full((S, 1 + L + N + 1), -1, dtype=torch.long)
    toks[:, 0] = PROMPT
    length = torch.ones(S, dtype=torch.long)
    rows = torch.arange(S)
    while bool((length < 1 + L).any()):
        anchor = toks[rows, length - 1]
        second = torch.where(length >= 2, toks[rows, (length - 2).clamp(min=0)], V)
        hidden = h_table[anchor]  # [S, N, H]
        base = model.compute_draft_logits(hidden.flatten(0, 1)).view(S, N, -1)
        walk = markov_walk(model, base, hidden, anchor, temps, seeds, length, topk=topk)
        probs = walk.draft_probs
        if corrupt == "no_markov":
            wrong = torch.softmax(base / temperature, -1)
            probs = DraftProbs(wrong, probs.cols, probs.token_probs, V)
            tcols = model.map_draft_to_target(torch.arange(base.shape[-1]))
            probs = DraftProbs.from_target(
                torch.zeros(S, N, V).index_copy_(2, tcols, wrong), walk.draft_ids
            )
        ctx = torch.cat([second[:, None], anchor[:, None], walk.draft_ids], dim=1)  # [S, N+2]
        t_logits = table[ctx[:, :-1], ctx[:, 1:]]  # [S, N+1, V]
        verify_len = None
        if sps is not None or plan is not None:
            plan = plan or (lambda c: plan_verify_lengths(c, sps).verify_len)
            conf = walk.confidence.view(S // GROUP, GROUP, N)
            verify_len = torch.cat([plan(c) for c in conf])
        out = rejection_verify(walk.draft_ids, probs, t_logits, temps, seeds, length, verify_len)
        k = torch.arange(N + 1)
        active = length < 1 + L  # finished requests ride along but write nothing
        write = (k.unsqueeze(0) <= out.num_accepted.unsqueeze(1)) & active.unsqueeze(1)
        r, c = write.nonzero(as_tuple=True)
        toks[r, length[r] + c] = out.output_ids[r, c]
        length = torch.where(active, length + out.num_output, length)
    return toks[:, 1 : 1 + L]


def seq_counts(seqs: torch.Tensor) -> torch.Tensor:
    idx = torch.zeros(seqs.shape[0], dtype=torch.long)
    for j in range(L):
        idx = idx * V + seqs[:, j]
    return torch.bincount(idx, minlength=V**L)


def chi2_p(counts, probs) -> float:
    """Chi-square p-value; cells with expected count < 5 are pooled into one."""
    counts, probs = counts.double(), probs.double()
    exp = probs / probs.sum() * counts.sum()
    assert counts[exp == 0].sum() == 0, "generated a sequence the target cannot"
    big = exp >= 5
    obs = torch.cat([counts[big], counts[~big].sum().view(1)])
    e = torch.cat([exp[big], exp[~big].sum().view(1)])
    return float(stats.chisquare(obs.numpy(), e.numpy()).pvalue)


def sps_table() -> SPSTable:
    """1 / latency with latency affine in the tokens verified: some drafts admitted, not all."""
    sizes = list(range(1, GROUP * 8 + 1))
    return SPSTable(sizes, [1.0 / (1.0 + 0.03 * n) for n in sizes])


CASES = {
    # name: (model kwargs, temperature, topk, adaptive)
    "vanilla-anchor-full": (dict(markov_head_type="vanilla"), 1.0, None, False),
    "gated-1+N-reduced": (
        dict(markov_head_type="gated", sample_from_anchor=False, dv=4),
        0.7,
        None,
        False,
    ),
    "rnn-anchor-reduced-adaptive": (dict(markov_head_type="rnn", dv=4), 1.0, None, True),
    "vanilla-reduced-topk": (dict(markov_head_type="vanilla", dv=5), 1.0, 2, False),
    "rnn-1+N-full-topk-adaptive": (
        dict(markov_head_type="rnn", sample_from_anchor=False),
        0.8,
        3,
        True,
    ),
}
S = 20_000


def build(kw):
    kw = dict(kw)
    dv = kw.pop("dv", None)
    return tiny_model(seed=11, vocab_size=V, draft_vocab_size=dv, block_size=4, **kw)


@pytest.mark.parametrize("name", list(CASES))
def test_speculative_sampling_is_lossless(name):
    kw, temp, topk, adaptive = CASES[name]
    model, table = build(kw), target_table()
    sps = sps_table() if adaptive else None
    seqs = speculative_decode(model, table, S, temp, topk=topk, sps=sps)
    assert chi2_p(seq_counts(seqs), exact_distribution(table, temp)) > 1e-3


def test_vllm_budget_policy_is_lossless():
    """vLLM 0.34's batch budget (a global argmax, then survival allocation) on the engine's
    padded cost model, with a confidence head that reads the previous draft token."""
    from common.sampling.draft_budget import PaddedCostTable, plan_budgeted_verify_lengths

    model, table = build(dict(markov_head_type="vanilla")), target_table()
    n = model.config.num_speculative_tokens
    assert model.config.confidence_head_with_markov
    rows = [[0.0] + [1.0 + 0.6 * q for q in range(1, n + 2)] for _ in range(GROUP + 1)]
    cost = PaddedCostTable([0.5] * (GROUP + 1), rows, {})
    lengths = []

    def plan(c):
        lengths.append(plan_budgeted_verify_lengths(c, cost))
        return lengths[-1]

    seqs = speculative_decode(model, table, S, 1.0, plan=plan)
    verified = torch.cat(lengths)
    assert 0 < int(verified.sum()) < verified.numel() * n  # budgets really were partial
    assert chi2_p(seq_counts(seqs), exact_distribution(table, 1.0)) > 1e-3


def test_adaptive_planner_really_shortens_blocks():
    model = build(dict(markov_head_type="rnn", dv=4))
    N = model.config.num_speculative_tokens
    conf = torch.rand(64, N, generator=torch.Generator().manual_seed(0))
    lens = plan_verify_lengths(conf[:GROUP], sps_table()).verify_len
    assert 0 < int(lens.sum()) < GROUP * N


@pytest.mark.parametrize("bug", ["residual_is_target", "p_d_without_markov"])
def test_lossless_check_detects_bugs(bug, monkeypatch):
    model, table = build(dict(markov_head_type="vanilla", dv=5)), target_table()
    corrupt = None
    if bug == "residual_is_target":
        monkeypatch.setattr(verify_mod, "_residual_probs", lambda p_t, p_d: p_t)
    else:
        corrupt = "no_markov"
    seqs = speculative_decode(model, table, S, 1.0, corrupt=corrupt)
    assert chi2_p(seq_counts(seqs), exact_distribution(table, 1.0)) < 1e-6


def test_greedy_speculative_decoding_is_target_greedy():
    model, table = build(dict(markov_head_type="gated", dv=4)), target_table()
    seqs = speculative_decode(model, table, 64, 0.0)
    prev2, prev1, ref = V, PROMPT, []
    for _ in range(L):
        x = int(table[prev2, prev1].argmax())
        ref.append(x)
        prev2, prev1 = prev1, x
    assert (seqs == torch.tensor(ref)).all()


@pytest.mark.slow
@pytest.mark.parametrize("head", MARKOV_HEAD_TYPES)
@pytest.mark.parametrize("anchor", [True, False])
@pytest.mark.parametrize("dv", [None, 4])
@pytest.mark.parametrize("adaptive", [False, True])
def test_lossless_full_grid(head, anchor, dv, adaptive):
    model = build(dict(markov_head_type=head, sample_from_anchor=anchor, dv=dv))
    table = target_table(seed=1)
    seqs = speculative_decode(model, table, S, 0.9, sps=sps_table() if adaptive else None)
    assert chi2_p(seq_counts(seqs), exact_distribution(table, 0.9)) > 1e-3
