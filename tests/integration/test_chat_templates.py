"""Assistant masks from real chat templates without `{% generation %}` markers.

The templates are the models' own (tests/data/chat_templates/README.md says where each came from).
Each runs with a tiny byte-level BPE that has the template's special tokens as added tokens. The
expected assistant text of every conversation is written out by hand below, independent of the
algorithm; the expected mask marks the tokens that overlap those substrings of the rendered text.
"""

from pathlib import Path

import pytest
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from train.data import BadRowError, ChatTemplateError, Renderer
from train.tiny_target.tokenizer import SPLIT_PATTERN

TEMPLATES = Path(__file__).parents[1] / "data" / "chat_templates"
CORPUS = [
    "You are terse. What is the capital of France? Paris. And of Italy? Rome. And of Spain? "
    "Madrid. The capital is a city; think about it."
] * 20

SYS = {"role": "system", "content": "You are terse."}
QA = [
    ("What is the capital of France?", "Paris."),
    ("And of Italy?", "Rome."),
    ("And of Spain?", "Madrid."),
]


def conversation(turns: int, system: bool = True, answers=None) -> list[dict]:
    msgs = [SYS] if system else []
    for t in range(turns):
        q, a = QA[t]
        msgs += [
            {"role": "user", "content": q},
            {"role": "assistant", "content": (answers or {}).get(t, a)},
        ]
    return msgs


def tiny_tokenizer(specials, *, eos, bos=None, pad=None, added=()) -> PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(CORPUS, trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=eos,
        bos_token=bos,
        pad_token=pad,
        clean_up_tokenization_spaces=False,
    )
    if added:
        tok.add_tokens(list(added))  # non-special added tokens, like Qwen's <think>
    return tok


# name -> (template file, tokenizer kwargs, template kwargs)
QWEN = (
    ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    dict(eos="<|im_end|>", pad="<|endoftext|>", added=("<think>", "</think>")),
)
DEEPSEEK = (
    ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"],
    dict(bos="<｜begin▁of▁sentence｜>", eos="<｜end▁of▁sentence｜>", added=("<think>", "</think>")),
)
FAMILIES = {
    "qwen3": ("qwen3.jinja", QWEN, {}),
    "qwen3_no_thinking": ("qwen3.jinja", QWEN, {"enable_thinking": False}),
    "qwen2_5": ("qwen2_5_instruct.jinja", QWEN, {}),
    "llama3_1": (
        "llama3_1_instruct.jinja",
        (
            [
                "<|begin_of_text|>",
                "<|end_of_text|>",
                "<|start_header_id|>",
                "<|end_header_id|>",
                "<|eot_id|>",
                "<|eom_id|>",
                "<|python_tag|>",
            ],
            dict(bos="<|begin_of_text|>", eos="<|eot_id|>"),
        ),
        {},
    ),
    "smollm2": (
        "smollm2_instruct.jinja",
        (
            ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            dict(eos="<|im_end|>", bos="<|im_start|>"),
        ),
        {},
    ),
    "gemma3": (
        "gemma3_it.jinja",
        (
            ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>"],
            dict(bos="<bos>", eos="<eos>", pad="<pad>"),
        ),
        {},
    ),
    "mistral_v3": (
        "mistral_v3_instruct.jinja",
        (
            ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]"],
            dict(bos="<s>", eos="</s>"),
        ),
        {},
    ),
    "phi3_5": (
        "phi3_5_mini_instruct.jinja",
        (
            ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"],
            dict(eos="<|endoftext|>", pad="<|endoftext|>"),
        ),
        {},
    ),
    "phi3_mini_old": (
        "phi3_mini_instruct.jinja",
        (
            ["<s>", "</s>", "<|endoftext|>", "<|user|>", "<|assistant|>", "<|end|>"],
            dict(bos="<s>", eos="<|endoftext|>"),
        ),
        {},
    ),
    "deepseek_r1_distill": ("deepseek_r1_distill.jinja", DEEPSEEK, {}),
    "deepseek_v3_1": ("deepseek_v3_1.jinja", DEEPSEEK, {}),
    "deepseek_v3_1_thinking": ("deepseek_v3_1.jinja", DEEPSEEK, {"enable_thinking": True}),
}

# Hand-marked: (family, turns, system) -> the supervised substrings of the rendered sample, in
# order, and whether only the final turn is supervised. The rule (train/data/spans.py): content +
# end-of-turn token(s); not the role header / generation prompt; not the newline after it.
EXPECTED = {
    # Qwen3 renders an (empty) think block for the last turn only: 2+ turns are not prefix-stable.
    ("qwen3", 1, True): (["<think>\n\n</think>\n\nParis.<|im_end|>"], False),
    ("qwen3", 2, True): (["<think>\n\n</think>\n\nRome.<|im_end|>"], True),
    ("qwen3", 3, True): (["<think>\n\n</think>\n\nMadrid.<|im_end|>"], True),
    # Without thinking the empty think block is part of the generation prompt: header, not target.
    ("qwen3_no_thinking", 1, True): (["Paris.<|im_end|>"], False),
    ("qwen3_no_thinking", 2, True): (["Rome.<|im_end|>"], True),
    ("qwen3_no_thinking", 3, True): (["Madrid.<|im_end|>"], True),
    ("llama3_1", 2, True): (["Paris.<|eot_id|>", "Rome.<|eot_id|>"], False),
    ("llama3_1", 3, True): (["Paris.<|eot_id|>", "Rome.<|eot_id|>", "Madrid.<|eot_id|>"], False),
    # Qwen2.5 writes its default system prompt when there is none: prompt, never supervised.
    ("qwen2_5", 2, True): (["Paris.<|im_end|>", "Rome.<|im_end|>"], False),
    ("qwen2_5", 3, False): (["Paris.<|im_end|>", "Rome.<|im_end|>", "Madrid.<|im_end|>"], False),
    ("smollm2", 2, True): (["Paris.<|im_end|>", "Rome.<|im_end|>"], False),
    ("smollm2", 3, False): (["Paris.<|im_end|>", "Rome.<|im_end|>", "Madrid.<|im_end|>"], False),
    ("gemma3", 2, True): (["Paris.<end_of_turn>", "Rome.<end_of_turn>"], False),
    ("gemma3", 3, True): (
        ["Paris.<end_of_turn>", "Rome.<end_of_turn>", "Madrid.<end_of_turn>"],
        False,
    ),
    # Mistral writes " " + answer + eos after [/INST]; there is no generation prompt.
    ("mistral_v3", 2, False): ([" Paris.</s>", " Rome.</s>"], False),
    ("mistral_v3", 3, False): ([" Paris.</s>", " Rome.</s>", " Madrid.</s>"], False),
    # Phi-3.5 ends a prompt-less render with eos_token: not an assistant token.
    ("phi3_5", 2, True): (["Paris.<|end|>", "Rome.<|end|>"], False),
    ("phi3_5", 3, True): (["Paris.<|end|>", "Rome.<|end|>", "Madrid.<|end|>"], False),
    ("phi3_mini_old", 2, False): (["Paris.<|end|>", "Rome.<|end|>"], False),
    ("phi3_mini_old", 3, False): (["Paris.<|end|>", "Rome.<|end|>", "Madrid.<|end|>"], False),
    # DeepSeek-R1 prompts with "<｜Assistant｜><think>\n" but renders "<｜Assistant｜>answer".
    ("deepseek_r1_distill", 2, True): (
        ["Paris.<｜end▁of▁sentence｜>", "Rome.<｜end▁of▁sentence｜>"],
        False,
    ),
    (
        "deepseek_r1_distill",
        3,
        True,
    ): (
        [
            "Paris.<｜end▁of▁sentence｜>",
            "Rome.<｜end▁of▁sentence｜>",
            "Madrid.<｜end▁of▁sentence｜>",
        ],
        False,
    ),
    # DeepSeek-V3.1 without thinking prompts with "<think></think>": header, not target.
    ("deepseek_v3_1", 2, True): (
        ["Paris.<｜end▁of▁sentence｜>", "Rome.<｜end▁of▁sentence｜>"],
        False,
    ),
    # With thinking it prompts with "<think>"; the rendered turn closes it: "</think>" is emitted.
    ("deepseek_v3_1_thinking", 2, True): (
        ["</think>Paris.<｜end▁of▁sentence｜>", "</think>Rome.<｜end▁of▁sentence｜>"],
        False,
    ),
}


_TOKENIZERS = {}


def family(name):
    file, (specials, tok_kwargs), template_kwargs = FAMILIES[name]
    if name not in _TOKENIZERS:
        tok = tiny_tokenizer(specials, **tok_kwargs)
        tok.chat_template = (TEMPLATES / file).read_text(encoding="utf-8")
        tok.name_or_path = f"tiny-{name}"
        _TOKENIZERS[name] = tok
    return _TOKENIZERS[name], Renderer(_TOKENIZERS[name], template_kwargs=template_kwargs)


def hand_mask(tok, ids, spans) -> list[bool]:
    """Tokens overlapping the hand-written substrings, found in order in the decoded sample."""
    text = tok.decode(ids, skip_special_tokens=False)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    assert enc["input_ids"] == ids, "the sample must be the tokenization of its own text"
    marked, at = [], 0
    for s in spans:
        start = text.index(s, at)  # ValueError if the expected text is not there
        marked.append((start, start + len(s)))
        at = start + len(s)
    return [any(a < e and b > s for s, e in marked) for a, b in enc["offset_mapping"]]


def supervised_runs(tok, ids, mask) -> list[str]:
    runs, cur = [], None
    for t, m in zip(ids, mask):
        if m:
            cur = (cur or []) + [t]
        elif cur is not None:
            runs.append(tok.decode(cur, skip_special_tokens=False))
            cur = None
    return runs + ([tok.decode(cur, skip_special_tokens=False)] if cur else [])


@pytest.mark.parametrize(
    "key", sorted(EXPECTED), ids=lambda k: f"{k[0]}-{k[1]}turns-{'sys' if k[2] else 'nosys'}"
)
def test_real_template_mask_matches_hand_marked(key):
    name, turns, system = key
    spans, final_only = EXPECTED[key]
    tok, renderer = family(name)
    msgs = conversation(turns, system)
    r = renderer.render({"messages": msgs}, 0)
    assert len(r.ids) == len(r.mask)
    assert r.mask == hand_mask(tok, r.ids, spans)  # token by token
    assert supervised_runs(tok, r.ids, r.mask) == spans
    assert ("final_turn_only" in r.notes) == final_only
    # The sample is the template's own render of the conversation (which ends with the final
    # assistant turn here, so also in the final-turn-only case).
    kwargs = FAMILIES[name][2]
    own = tok.apply_chat_template(msgs, tokenize=True, return_dict=True, **kwargs)["input_ids"]
    assert r.ids == own


def test_qwen3_reasoning_is_supervised_on_the_final_turn_and_stripped_before():
    tok, renderer = family("qwen3")
    thought = {
        0: "<think>\nFrance: Paris.\n</think>\n\nParis.",
        1: "<think>\nItaly: Rome.\n</think>\n\nRome.",
    }
    r = renderer.render({"messages": conversation(2, answers=thought)}, 0)
    assert supervised_runs(tok, r.ids, r.mask) == [
        "<think>\nItaly: Rome.\n</think>\n\nRome.<|im_end|>"
    ]
    text = tok.decode(r.ids)
    assert (
        "France: Paris." not in text
    )  # the template drops earlier reasoning: context as at inference
    assert "final_turn_only" in r.notes


def test_deepseek_strips_reasoning_and_supervises_the_rendered_answer():
    tok, renderer = family("deepseek_r1_distill")
    r = renderer.render(
        {"messages": conversation(1, answers={0: "<think>\nhmm\n</think>\n\nParis."})}, 0
    )
    assert supervised_runs(tok, r.ids, r.mask) == ["\n\nParis.<｜end▁of▁sentence｜>"]


def test_generation_markers_and_incremental_rendering_agree():
    """Control: the same ChatML template, with and without {% generation %} markers."""
    tok, _ = family("smollm2")
    marked = (
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n'}}"
        "{% if message['role'] == 'assistant' %}{% generation %}"
        "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
        "{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    plain = marked.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    row = {"messages": conversation(3)}
    assert Renderer(tok, chat_template=marked)(row, 0) == Renderer(tok, chat_template=plain)(row, 0)


# ---- negative controls ------------------------------------------------------------------------


def test_mistral_with_a_system_message_is_not_prefix_stable():
    """Mistral v3 writes the system prompt into the LAST user turn only, so it vanishes from the
    render once an answer follows: no sample matches what the model saw. Refused, naming it."""
    _, renderer = family("mistral_v3")
    with pytest.raises(
        ChatTemplateError, match="tiny-mistral_v3.*not prefix-stable.*data.chat_template"
    ):
        renderer.render({"messages": conversation(2, system=True)}, 3)


def test_a_template_that_rewrites_history_is_refused():
    tok, _ = family("smollm2")
    counter = (
        "{{ messages|length }} messages\n" + (TEMPLATES / "smollm2_instruct.jinja").read_text()
    )
    with pytest.raises(ChatTemplateError, match="not prefix-stable"):
        Renderer(tok, chat_template=counter).render({"messages": conversation(2)}, 0)


@pytest.mark.parametrize(
    "assistant",
    [
        "{{ '<|im_start|>assistant\\n<|im_end|>\\n' }}",  # drops the answer
        # truncates it
        "{{ '<|im_start|>assistant\\n' + message['content'][:2] + '<|im_end|>\\n' }}",
    ],
    ids=["dropped", "truncated"],
)
def test_a_template_that_drops_assistant_content_is_refused(assistant):
    tok, _ = family("smollm2")
    template = (
        "{% for message in messages %}{% if message['role'] == 'assistant' %}"
        + assistant
        + "{% else %}"
        "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
        "{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    with pytest.raises(ChatTemplateError, match="drops or rewrites assistant content"):
        Renderer(tok, chat_template=template).render({"messages": conversation(2)}, 0)


def test_a_template_that_only_renders_whole_conversations_is_refused():
    tok, _ = family("smollm2")
    template = (
        "{% if messages[-1]['role'] != 'assistant' %}{{ raise_exception('end with an answer') }}"
        "{% endif %}" + (TEMPLATES / "smollm2_instruct.jinja").read_text()
    )
    with pytest.raises(ChatTemplateError, match="renders the row but not its first turns"):
        Renderer(tok, chat_template=template).render({"messages": conversation(2)}, 0)


def test_roles_the_template_cannot_render_are_a_bad_row():
    _, renderer = family("gemma3")
    msgs = [
        {"role": "user", "content": "a"},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "c"},
    ]
    with pytest.raises(BadRowError, match="row 5: chat template rejected the row.*alternate") as e:
        renderer.render({"messages": msgs}, 5)
    assert e.value.reason == "template_rejected"


def test_show_mask_marks_a_template_without_markers(tmp_path, capsys):
    import json

    from train.prepare.show_mask import main

    tok, _ = family("qwen3")
    tok.save_pretrained(tmp_path / "tok")
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"messages": conversation(2)}) + "\n")
    args = ["--tokenizer", str(tmp_path / "tok"), "--data", str(data), "--color", "never"]
    assert main([*args, "--chat-template-kwargs", '{"enable_thinking": false}']) == 0
    out = capsys.readouterr().out
    assert "row 0 [final_turn_only]" in out and "[[Rome.<|im_end|>]]" in out
    assert "[[Paris." not in out


def _phi35_marked() -> str:
    plain = (TEMPLATES / "phi3_5_mini_instruct.jinja").read_text()
    old = "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}"
    assert old in plain
    new = (
        "{{'<|assistant|>\n'}}{% generation %}{{ message['content'] + '<|end|>' }}"
        "{% endgeneration %}{{'\n'}}"
    )
    return plain.replace(old, new)


@pytest.mark.parametrize("name", ["chatml", "phi3_5"])
def test_incremental_rendering_equals_the_generation_marker_reference_on_varied_rows(name):
    """HF's own {% generation %} mask is an independent reference: on the same template with and
    without markers, with awkward content (leading/trailing whitespace and newlines, unicode,
    system or not, 1-4 turns), the incremental spans must be identical. Phi-3.5 also appends an
    end-of-conversation eos that must stay unsupervised."""
    import random

    from tests.integration.test_data import CHATML, CHATML_NO_GENERATION, make_tokenizer

    if name == "chatml":
        tok, marked, plain = make_tokenizer(), CHATML, CHATML_NO_GENERATION
    else:
        tok = family("phi3_5")[0]
        marked, plain = _phi35_marked(), (TEMPLATES / "phi3_5_mini_instruct.jinja").read_text()
    rng = random.Random(0)
    pieces = ["Hello", " there", "\n", "  ", "\n\n", "wind", "é", "海", "?", " 42", "\t"]

    def text():
        s = "".join(rng.choices(pieces, k=rng.randint(1, 8))).strip(" \t")
        return s if s.strip() else s + "x"

    for i in range(40):
        msgs = [{"role": "system", "content": text()}] if i % 2 else []
        for _ in range(1 + i % 4):
            msgs += [{"role": "user", "content": text()}, {"role": "assistant", "content": text()}]
        row = {"messages": msgs}
        ref = Renderer(tok, chat_template=marked)(row, i)
        assert any(ref[1]), "the reference must supervise something"
        assert Renderer(tok, chat_template=plain)(row, i) == ref, msgs


def sharegpt(question: str, answer: str, system: bool) -> dict:
    turns = [{"from": "system", "value": SYS["content"]}] if system else []
    return {
        "conversations": turns
        + [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]
    }


@pytest.mark.parametrize("name", ["smollm2", "gemma3", "qwen2_5"])
def test_raw_sharegpt_with_long_first_prompts_trains_on_the_rest(name, tmp_path, capsys):
    """Raw ShareGPT rows (`conversations` of from/value) with each family's real template, two of
    whose first answers start past seq_len: those two are skipped for length, not bad rows, so the
    default data.max_bad_row_share=0.05 does not stop the run, and the rest is supervised on its
    answers. The answers' positions come from the rendered text, not from the code under test."""
    import json

    from tests.integration.test_bad_rows import Cfg, cfg
    from train.data.splits import build_split

    tok, _ = family(name)
    rows = [sharegpt(q, a, system=i % 2 == 0) for i, (q, a) in enumerate(QA * 3)][:8]
    rows += [sharegpt(CORPUS[0] * 6, "Paris.", system=s) for s in (True, False)]
    path = tmp_path / "sharegpt.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def first_answer_token(row) -> int:
        msgs = [
            {
                "role": {"human": "user", "gpt": "assistant"}.get(t["from"], t["from"]),
                "content": t["value"],
            }
            for t in row["conversations"]
        ]
        text = tok.apply_chat_template(msgs, tokenize=False)
        prompt = msgs[-2]["content"]
        start = text.index(msgs[-1]["content"], text.index(prompt) + len(prompt))
        before = tok(text[:start], add_special_tokens=False)["input_ids"]
        assert tok(text, add_special_tokens=False)["input_ids"][: len(before)] == before
        return len(before)

    seq_len = 128
    firsts = [first_answer_token(r) for r in rows]
    assert all(f < seq_len for f in firsts[:8]) and all(f >= seq_len for f in firsts[8:]), firsts
    ds = build_split(Cfg(cfg(seq_len=seq_len, max_bad_row_share=0.05)), str(path), tok, seed=0)
    out = capsys.readouterr().out
    assert "10 rows read, 8 used, 0 dropped (0.0%), 2 skipped for length" in out
    assert f"data.seq_len={max(firsts[8:]) + 1} keeps them all" in out
    supervised = [
        tok.decode(
            [t for t, m in zip(r["input_ids"], r["loss_mask"]) if m], skip_special_tokens=True
        )
        for r in ds
    ]
    for q, a in QA:
        assert sum(s.count(a) for s in supervised) == sum(
            r["conversations"][-1]["value"] == a for r in rows[:8]
        )
        assert all(q not in s for s in supervised)
