"""Stop strings in the engine (serve/engine/text.py): the incremental detokenizer against whole
decodes, the stop-string search against str.find, and the engine's cut against the target's
full greedy text cut where the stop string first appears, including cuts in the middle of a
speculative round (a tuned draft makes every round emit N + 1 tokens)."""

from __future__ import annotations

import pytest

from serve.engine import Engine, EngineOptions, SamplingParams
from serve.engine.text import (
    IncrementalDetokenizer,
    StopStrings,
    cut_at_stop,
    earliest_stop,
    held_back,
)
from tests.unit.test_engine_helpers import make_draft, make_target, make_tokenizer, reference_greedy

pytestmark = pytest.mark.usefixtures("torch_single_thread")
N = 4  # the tuned draft's drafts per round: rounds emit N + 1 tokens


def byte_bpe():
    """A byte-level BPE trained here on text with multi-byte characters, so some tokens end
    inside a character."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    corpus = ["naïve café résumé 日本語のテキスト", "über straße déjà vu 東京", "plain words"] * 3
    tk.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, show_progress=False))
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tk)


def test_incremental_text_equals_whole_decodes_and_waits_for_whole_characters():
    tok = byte_bpe()
    ids = tok.encode("déjà 日本 naïve x東京y")
    detok = IncrementalDetokenizer(tok)
    split_chars = 0
    for k, t in enumerate(ids, 1):
        detok.push(t)
        whole = tok.decode(ids[:k])
        if whole.endswith("\ufffd"):  # the token ends inside a character: it waits
            split_chars += 1
            assert "\ufffd" not in detok.text and whole.startswith(detok.text)
        else:
            assert detok.text == whole
    assert split_chars > 0  # the case is exercised
    assert detok.flush() == "" and detok.text == tok.decode(ids)
    # An output ending inside a character shows its bytes at the end, as a whole decode does.
    cut = IncrementalDetokenizer(tok)
    partial = next(k for k in range(1, len(ids)) if tok.decode(ids[:k]).endswith("\ufffd"))
    for t in ids[:partial]:
        cut.push(t)
    cut.flush()
    assert cut.text == tok.decode(ids[:partial])


def naive_first_stop(text: str, stops: list[str]):
    """Independent: grow the text a character at a time; the first stop string to appear."""
    for end in range(1, len(text) + 1):
        for s in stops:
            if text[:end].endswith(s):
                return s, end - len(s)
    return None


@pytest.mark.parametrize(
    "text,stops",
    [
        ("abcdef", ["cd"]),
        ("abcdef", ["abcd", "bc"]),  # "bc" completes first though "abcd" starts first
        ("abcdef", ["ef", "zz"]),
        ("aaaa", ["aa"]),
        ("abc", ["x"]),
        ("hello world", ["o w", "wor", "d"]),
    ],
)
def test_earliest_stop_is_the_first_to_complete(text, stops):
    assert earliest_stop(text, stops, 0) == naive_first_stop(text, stops)


def test_held_back_is_the_longest_tail_that_could_start_a_stop_string():
    assert held_back("hello wo", ["world"]) == 2
    assert held_back("hello w", ["world", "low"]) == 1
    assert held_back("hello", ["xyz"]) == 0
    assert held_back("abab", ["abac"]) == 2
    assert cut_at_stop("one. two. three", ". ") == "one"
    assert cut_at_stop("one. two. three", ". ", include=True) == "one. "


def test_stop_strings_keep_tokens_up_to_the_one_completing_the_stop():
    tok = make_tokenizer()
    ids = [20, 21, 22, 23, 24]  # "w13 w14 w15 w16 w17"
    st = StopStrings(tok, ["4 w1"])  # starts in token 1, completes in token 2
    assert st.push(ids[:1]) is None
    assert st.push(ids[1:]) == (2, "4 w1")  # of the four pushed, keep two


def tiny_engine(num_seqs: int = 2):
    target = make_target(0, predictable=True, sharpness=30.0)
    draft = make_draft(target, True, None, tuned=True)
    opts = EngineOptions(target="<m>", checkpoint="<m>", dtype="float64", max_num_seqs=num_seqs)
    return target, Engine(target, draft, opts, tokenizer=make_tokenizer(), eos_token_ids=[])


def stops_across_tokens(tok, ref: list[int]) -> list[tuple[str, int]]:
    """Stop strings spanning two words of the greedy text (the end of word j, the space, the
    start of word j+1: one word per token), with the tokens the output should keep: the fewest
    whose text holds the stop string (computed by whole decodes)."""
    words = tok.decode(ref, skip_special_tokens=True).split(" ")
    out = []
    for j in range(1, 14):
        stop = f"{words[j][-1]} {words[j + 1][:2]}"
        keep = next(
            k
            for k in range(1, len(ref) + 1)
            if stop in tok.decode(ref[:k], skip_special_tokens=True)
        )
        out.append((stop, keep))
    return out


def test_engine_stops_at_a_stop_string_split_across_tokens_even_mid_round():
    target, eng = tiny_engine()
    tok = eng.tokenizer
    prompt = [5, 7, 9]
    ref = reference_greedy(target, prompt, 40)
    full = tok.decode(ref, skip_special_tokens=True)
    cases = stops_across_tokens(tok, ref)
    # The first token comes from the prefill, then rounds of N + 1: keeping k tokens ends a
    # round only when (k - 1) % (N + 1) == 0; most cases cut a round short.
    assert any((keep - 1) % (N + 1) for _, keep in cases)
    for stop, keep in cases:
        s0 = eng.stats.snapshot()
        rid = eng.add_request(prompt, SamplingParams(max_tokens=40, stop=[stop, "zzz"]))
        got, last = [], None
        while last is None or not last.finished:
            for o in eng.step():
                if o.request_id == rid:
                    got += o.new_token_ids
                    last = o
        assert got == ref[:keep], stop
        assert last.finish_reason == "stop" and last.stop_str == stop
        text = tok.decode(got, skip_special_tokens=True)
        assert cut_at_stop(text, stop) == full[: full.find(stop)]
        s1 = eng.stats.snapshot()
        assert s1.generation_tokens - s0.generation_tokens == keep
        assert s1.requests_finished - s0.requests_finished == 1
    assert not eng.requests and eng.scheduler.num_free_slots == 2


def test_without_a_tokenizer_stop_strings_are_refused():
    target = make_target(0)
    eng = Engine(target, None, EngineOptions(target="<m>", dtype="float64"), eos_token_ids=[])
    with pytest.raises(ValueError, match="tokenizer"):
        eng.add_request([5, 6], SamplingParams(stop=["x"]))


@pytest.mark.parametrize("stop", [["a"] * 5, [""], ["ok", ""]])
def test_sampling_params_bound_stop_strings(stop):
    with pytest.raises(ValueError, match="stop"):
        SamplingParams(stop=stop)


def test_requests_without_stop_strings_do_no_text_work():
    _, eng = tiny_engine()
    calls = {"n": 0}
    real = eng.tokenizer.decode

    def counted(*a, **k):
        calls["n"] += 1
        return real(*a, **k)

    eng.tokenizer.decode = counted
    eng.generate([[5, 7]], SamplingParams(max_tokens=12, ignore_eos=True))
    assert calls["n"] == 0
    eng.generate([[5, 7]], SamplingParams(max_tokens=12, stop=["zzz"]))
    assert calls["n"] > 0
