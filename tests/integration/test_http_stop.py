"""`stop` strings over HTTP (in process, the app's lifespan running the engine thread):
completions and chat, streaming and not, against an independent reference: the same request's
full text without `stop`, cut with str.find where the stop string first appears. The stop
strings span two tokens, and the tuned draft emits N + 1 tokens a round, so most cuts land
mid-round; a streamed response must never show part of the stop string."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from serve.api import build_app
from serve.engine import Engine, EngineOptions
from tests.unit.test_engine_helpers import make_draft, make_target, make_tokenizer

pytestmark = pytest.mark.usefixtures("torch_single_thread")
MAX_TOKENS = 30


@pytest.fixture(scope="module")
def client():
    import torch

    torch.set_num_threads(1)
    target = make_target(0, predictable=True, sharpness=30.0)
    opts = EngineOptions(target="<m>", checkpoint="<m>", dtype="float64", max_num_seqs=4)
    engine = Engine(target, make_draft(target, True, None, tuned=True), opts, make_tokenizer(), [])
    with TestClient(build_app(engine, "m")) as c:
        yield c


def complete(client, body: dict, chat: bool) -> tuple[str, dict]:
    """(text, the choice) of a non-streaming request."""
    r = client.post("/v1/chat/completions" if chat else "/v1/completions", json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return (choice["message"]["content"] if chat else choice["text"]), r.json()


def stream(client, body: dict, chat: bool) -> tuple[list[str], list[dict]]:
    """(the text of each chunk, the chunks) of a streamed request."""
    path = "/v1/chat/completions" if chat else "/v1/completions"
    chunks = []
    with client.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: ") :]))
    texts = [
        (c["choices"][0]["delta"].get("content", "") if chat else c["choices"][0]["text"])
        for c in chunks
        if c["choices"]
    ]
    return texts, chunks


def request(chat: bool, temperature: float, **extra) -> dict:
    body = {"max_tokens": MAX_TOKENS, "temperature": temperature, "seed": 3, "ignore_eos": True}
    if chat:
        body["messages"] = [{"role": "user", "content": "w3 w4 w5"}]
    else:
        body["prompt"] = [5, 7, 9]
    return {**body, **extra}


def split_stops(full: str) -> list[str]:
    """Stop strings spanning two words (tokens) of `full`: the end of word j, the space, the
    start of word j+1."""
    words = full.split(" ")
    return [f"{words[j][-1]} {words[j + 1][:2]}" for j in range(1, min(len(words) - 1, 12), 2)]


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_stop_string_split_across_tokens_streaming_and_not(client, chat, temperature):
    full, _ = complete(client, request(chat, temperature, return_token_ids=True), chat)
    assert len(full.split(" ")) == MAX_TOKENS
    for stop in split_stops(full):
        expected = full[: full.find(stop)]
        text, body = complete(client, request(chat, temperature, stop=stop), chat)
        assert text == expected, stop
        assert body["choices"][0]["finish_reason"] == "stop"
        # Tokens up to the one completing the stop string: one past the words left whole.
        kept = len(expected.split(" ")) + 1
        assert body["usage"]["completion_tokens"] == kept
        texts, chunks = stream(client, request(chat, temperature, stop=[stop, "no such"]), chat)
        assert "".join(texts) == expected, stop
        finals = [c["choices"][0].get("finish_reason") for c in chunks if c["choices"]]
        assert finals[-1] == "stop" and set(finals[:-1]) <= {None}
        # Nothing sent ever held a piece of the stop string: every prefix sent is a prefix of
        # the expected text (which ends before the stop string starts).
        sent = ""
        for t in texts:
            sent += t
            assert expected.startswith(sent)


@pytest.mark.parametrize("chat", [False, True])
def test_the_stop_string_that_completes_first_wins_and_can_be_kept(client, chat):
    full, _ = complete(client, request(chat, 0.0), chat)
    a, b = split_stops(full)[:2]
    first = min((a, b), key=lambda s: full.find(s) + len(s))
    text, _ = complete(client, request(chat, 0.0, stop=[b, a]), chat)
    assert text == full[: full.find(first)]
    kept, _ = complete(client, request(chat, 0.0, stop=[a], include_stop_str_in_output=True), chat)
    assert kept == full[: full.find(a) + len(a)]
    texts, _ = stream(client, request(chat, 0.0, stop=a, include_stop_str_in_output=True), chat)
    assert "".join(texts) == kept


def test_a_stop_string_that_never_appears_changes_nothing(client):
    full, body = complete(client, request(False, 0.0), False)
    text, body2 = complete(client, request(False, 0.0, stop=["zzz"]), False)
    assert text == full and body2["choices"][0]["finish_reason"] == "length"


def test_held_back_text_is_sent_when_the_stop_string_does_not_complete(client):
    """A stop string whose first characters appear but which never completes: the held-back
    tail goes out once later text rules it out, and at the end in full."""
    full, _ = complete(client, request(False, 0.0), False)
    stop = full.split(" ")[1] + " zz"  # its prefix (a word and a space) appears, it never does
    texts, _ = stream(client, request(False, 0.0, stop=stop), False)
    assert "".join(texts) == full
