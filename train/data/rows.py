"""Validate raw dataset rows and normalise them to one of two kinds.

A row is either chat (`messages`: [{role, content}], or ShareGPT `conversations`: [{from,
value}]) or plain text (`text`). Downstream sees only a list of `{role, content, ...}` dicts or a
str. Every problem becomes a `BadRowError` that names the row index and a short `reason` key
(`REASONS`), so one bad row in a million-row file can be found, and skipped rows can be counted per
reason. Given a `dropped` list (the default data policy, `data.on_bad_row=skip`), a turn with
empty content or an unknown role is dropped and counted instead of failing the row; the row fails
only if what is left is unusable (no assistant turn). `on_bad_row=error` keeps every turn strict.

Arrow unifies struct schemas across a file, so a message that lacks a key another message has comes
back with that key set to None; None-valued extra keys are therefore dropped, not treated as errors.
"""

from collections.abc import Mapping

ROLES = frozenset({"system", "user", "assistant", "tool"})

# One list of the reasons a row or turn is dropped or changed; the data report prints these.
REASONS = {
    # the row is dropped
    "not_utf8": "not valid UTF-8",
    "not_json": "not valid JSON",
    "not_an_object": "not a JSON object / dict",
    "no_fields": "no `messages`, `conversations` or `text` field",
    "malformed": "malformed field (wrong type or shape)",
    "no_assistant": "no assistant turn after a prompt (nothing to supervise)",
    "empty_text": "empty `text`",
    "template_rejected": "the chat template cannot render it (e.g. roles it does not accept)",
    "no_supervised_tokens": "no supervised token after its first",
    # the turn is dropped, the row kept
    "empty_turn": "turn with empty content",
    "unknown_role": "turn with an unknown role",
    # the row is kept, changed
    "final_turn_only": "supervised on the final assistant turn only (the template rewrites "
    "earlier turns, see train/data/spans.py)",
    "regen_final_turn": "a regenerated row: supervised on its final assistant turn only (the "
    "target's answer; the earlier ones are the source's)",
    "truncated": "longer than data.seq_len, truncated",
    "split": "longer than data.seq_len, split into chunks",
}
TURN_REASONS = ("empty_turn", "unknown_role")

# ShareGPT speaker names seen in the wild -> chat-template roles.
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
}


class BadRowError(ValueError):
    """A row that cannot be rendered. `index` is its position in the dataset passed in."""

    def __init__(self, index: int, problem: str, reason: str = "malformed"):
        super().__init__(f"row {index}: {problem}")
        if reason not in REASONS:
            raise ValueError(f"unknown bad-row reason {reason!r}")
        self.index = index
        self.problem = problem
        self.reason = reason


def _messages(turns, index: int, sharegpt: bool, need_assistant: bool, dropped) -> list[dict]:
    field = "conversations" if sharegpt else "messages"
    role_key, content_key = ("from", "value") if sharegpt else ("role", "content")
    if not isinstance(turns, list | tuple) or not turns:
        raise BadRowError(index, f"`{field}` must be a non-empty list, got {turns!r:.80}")
    out = []
    for t, turn in enumerate(turns):
        where = f"{field}[{t}]"
        if not isinstance(turn, Mapping):
            raise BadRowError(index, f"{where} must be a dict, got {type(turn).__name__}")
        role = turn.get(role_key)
        if sharegpt:
            role = SHAREGPT_ROLES.get(role) if isinstance(role, str) else None
        if role not in ROLES:
            if dropped is not None:
                dropped.append("unknown_role")
                continue
            allowed = sorted(SHAREGPT_ROLES if sharegpt else ROLES)
            raise BadRowError(
                index,
                f"{where} has {role_key}={turn.get(role_key)!r}; use one of {allowed}",
                "unknown_role",
            )
        content = turn.get(content_key)
        if content is None and dropped is not None:
            dropped.append("empty_turn")
            continue
        if not isinstance(content, str):
            raise BadRowError(
                index,
                f"{where} ({role}) {content_key} must be a string, got {type(content).__name__}",
            )
        if not content.strip():
            if dropped is not None:
                dropped.append("empty_turn")
                continue
            raise BadRowError(index, f"{where} ({role}) has empty {content_key}", "empty_turn")
        extra = {
            k: v
            for k, v in turn.items()
            if k not in ("role", "content", "from", "value") and v is not None
        }
        out.append({**extra, "role": role, "content": content})
    if need_assistant and not any(m["role"] == "assistant" for m in out):
        left = " left after dropping empty/unknown turns" if len(out) < len(turns) else ""
        raise BadRowError(
            index,
            f"`{field}` has no assistant turn{left}, so nothing would be supervised",
            "no_assistant",
        )
    return out


def normalize_row(
    row: Mapping, index: int, need_assistant: bool = True, dropped: list[str] | None = None
) -> list[dict] | str:
    """Return the row's chat messages (list of {role, content, ...}) or its plain text (str).

    Precedence: `messages`, then `conversations`, then `text` (the first one that is not None), so a
    file that mixes chat and text rows (Arrow fills the missing column with None) works.
    Raises BadRowError naming `index` for anything malformed, including (with `need_assistant`) a
    conversation without an assistant turn. With a `dropped` list, turns with empty content or an
    unknown role are left out and their reasons appended to it instead (`TURN_REASONS`).
    """
    if not isinstance(row, Mapping):
        raise BadRowError(index, f"expected a dict, got {type(row).__name__}", "not_an_object")
    if row.get("messages") is not None:
        return _messages(row["messages"], index, False, need_assistant, dropped)
    if row.get("conversations") is not None:
        return _messages(row["conversations"], index, True, need_assistant, dropped)
    text = row.get("text")
    if text is not None:
        if not isinstance(text, str):
            raise BadRowError(index, f"`text` must be a string, got {type(text).__name__}")
        if not text.strip():
            raise BadRowError(index, "`text` is empty", "empty_text")
        return text
    raise BadRowError(
        index, f"no `messages`, `conversations` or `text` field (keys: {sorted(row)})", "no_fields"
    )
