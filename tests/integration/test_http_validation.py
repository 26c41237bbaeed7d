"""Request validation over HTTP (in process): vLLM 0.34's bounds, each checked on both sides
(the edge value accepted, just past it refused), and fields this server cannot honour refused
with a 400 naming them, in OpenAI's error body shape, while their neutral values pass."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from serve.api import build_app
from serve.engine import Engine, EngineOptions
from tests.unit.test_engine_helpers import make_target, make_tokenizer

pytestmark = pytest.mark.usefixtures("torch_single_thread")


@pytest.fixture(scope="module")
def client():
    import torch

    torch.set_num_threads(1)
    opts = EngineOptions(target="<m>", dtype="float64", max_model_len=64)
    engine = Engine(make_target(0), None, opts, make_tokenizer(), [])
    with TestClient(build_app(engine, "m")) as c:
        yield c


def send(client, extra: dict, chat: bool = False):
    if chat:
        body = {"messages": [{"role": "user", "content": "w1 w2"}], "max_tokens": 2}
        return client.post("/v1/chat/completions", json={**body, **extra})
    return client.post("/v1/completions", json={"prompt": [5, 6], "max_tokens": 2, **extra})


def assert_refused(r, param: str, needle: str):
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param and err["code"] == 400 and err["type"] == "BadRequestError"
    assert needle in err["message"], err["message"]


# (accepted, refused, param, the refusal's message) around each bound
BOUNDS = [
    ({"temperature": 0}, {"temperature": -0.01}, "temperature", "[0, 2]"),
    ({"temperature": 2.0}, {"temperature": 2.01}, "temperature", "[0, 2]"),
    ({"top_p": 1.0, "temperature": 0.5}, {"top_p": 1.01}, "top_p", "(0, 1]"),
    ({"top_p": 1e-6, "temperature": 0}, {"top_p": 0}, "top_p", "(0, 1]"),
    ({"top_p": 1.0}, {"top_p": 2}, "top_p", "(0, 1]"),
    ({"top_k": -1, "temperature": 0.5}, {"top_k": -2}, "top_k", "0 (disable), or at least 1"),
    ({"top_k": 0, "temperature": 0.5}, {"top_k": -2}, "top_k", "got -2"),
    ({"top_k": 1, "temperature": 0}, {"top_k": -3, "temperature": 0}, "top_k", "got -3"),
    ({"n": 1}, {"n": 0}, "n", "n must be at least 1"),
    ({"max_tokens": 1}, {"max_tokens": 0}, "max_tokens", "at least 1"),
    ({"min_p": 0.0}, {"min_p": 1.5}, "min_p", "[0, 1]"),
    ({"presence_penalty": 0}, {"presence_penalty": 2.5}, "presence_penalty", "[-2, 2]"),
    ({"frequency_penalty": 0}, {"frequency_penalty": -2.5}, "frequency_penalty", "[-2, 2]"),
    ({"repetition_penalty": 1}, {"repetition_penalty": 0}, "repetition_penalty", "zero"),
    ({"min_tokens": 0}, {"min_tokens": -1}, "min_tokens", "min_tokens"),
    ({"stop": ["a", "b", "c", "d"]}, {"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
    ({"stop": "w9"}, {"stop": ""}, "stop", "empty string"),
    ({"stop": ["w9"]}, {"stop": ["w9", ""]}, "stop", "empty string"),
]


@pytest.mark.parametrize("ok,bad,param,needle", BOUNDS)
def test_bounds_like_vllm_both_sides(client, ok, bad, param, needle):
    r = send(client, ok)
    assert r.status_code == 200, r.text
    assert_refused(send(client, bad), param, needle)


def test_chat_bounds(client):
    assert send(client, {"max_completion_tokens": 1}, chat=True).status_code == 200
    assert_refused(
        send(client, {"max_completion_tokens": 0}, chat=True), "max_completion_tokens", "at least"
    )
    assert_refused(send(client, {"top_p": 2}, chat=True), "top_p", "(0, 1]")
    assert_refused(send(client, {"stop": [""]}, chat=True), "stop", "empty")


# (a value asking for what the engine cannot do, its neutral value that must pass)
UNSUPPORTED = [
    ("n", 2, 1),
    ("top_p", 0.9, 1.0),  # with sampling; greedy requests may carry it (below)
    ("top_k", 40, 0),
    ("logprobs", 1, None),
    ("echo", True, False),
    ("suffix", "x", None),
    ("best_of", 2, 1),
    ("presence_penalty", 0.5, 0.0),
    ("frequency_penalty", 0.1, 0.0),
    ("repetition_penalty", 1.1, 1.0),
    ("min_p", 0.05, 0.0),
    ("min_tokens", 2, 0),
    ("logit_bias", {"5": 1.0}, {}),
    ("use_beam_search", True, False),
    ("skip_special_tokens", False, True),
    ("response_format", {"type": "json_object"}, {"type": "text"}),
    ("guided_json", {"type": "object"}, None),
    ("allowed_token_ids", [5], None),
]


@pytest.mark.parametrize("field,asks,neutral", UNSUPPORTED)
def test_unsupported_fields_are_refused_by_name_and_neutral_values_pass(
    client, field, asks, neutral
):
    assert_refused(send(client, {field: asks, "temperature": 0.7}), field, "not supported")
    r = send(client, {field: neutral, "temperature": 0.7})
    assert r.status_code == 200, r.text


def test_chat_only_fields(client):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert_refused(send(client, {"tools": tools}, chat=True), "tools", "not supported")
    assert_refused(send(client, {"logprobs": True}, chat=True), "logprobs", "not supported")
    assert_refused(send(client, {"top_logprobs": 2}, chat=True), "top_logprobs", "not supported")
    assert_refused(
        send(client, {"tool_choice": "required"}, chat=True), "tool_choice", "not supported"
    )
    neutral = {"logprobs": False, "top_logprobs": 0, "tools": [], "tool_choice": "none"}
    assert send(client, neutral, chat=True).status_code == 200


def test_greedy_requests_may_carry_top_p_and_top_k(client):
    """vLLM resets top_p/top_k for greedy requests; they change nothing there."""
    a = send(client, {"temperature": 0, "return_token_ids": True, "max_tokens": 6})
    b = send(client, {"temperature": 0, "top_p": 0.5, "top_k": 3, "return_token_ids": True,
                      "max_tokens": 6})  # fmt: skip
    assert a.status_code == b.status_code == 200
    assert a.json()["choices"][0]["token_ids"] == b.json()["choices"][0]["token_ids"]


def test_unknown_fields_are_ignored(client):
    assert send(client, {"user": "me", "some_future_field": 1}).status_code == 200


def test_stop_strings_need_a_tokenizer():
    opts = EngineOptions(target="<m>", dtype="float64", max_model_len=64)
    engine = Engine(make_target(0), None, opts, None, [])
    with TestClient(build_app(engine, "m")) as c:
        assert_refused(send(c, {"stop": "x"}), "stop", "tokenizer")
        assert send(c, {"stop_token_ids": [9]}).status_code == 200
