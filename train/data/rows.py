"""Validate raw dataset rows and normalise them to one of two kinds.

A row is either chat (`messages`: [{role, content}], or ShareGPT `conversations`: [{from,
value}]) or plain text (`text`). Downstream sees only a list of `{role, content, ...}` dicts or a
str. Every problem becomes a `BadRowError` that names the row index, so one bad row in a
million-row file can be found and fixed (or skipped on purpose with `on_bad_row="skip"`).

Arrow unifies struct schemas across a file, so a message that lacks a key another message has comes
back with that key set to None; None-valued extra keys are therefore dropped, not treated as errors.
"""

from collections.abc import Mapping

ROLES = frozenset({"system", "user", "assistant", "tool"})

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

    def __init__(self, index: int, problem: str):
        super().__init__(f"row {index}: {problem}")
        self.index = index
        self.problem = problem


def _messages(turns, index: int, sharegpt: bool, need_assistant: bool) -> list[dict]:
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
            allowed = sorted(SHAREGPT_ROLES if sharegpt else ROLES)
            raise BadRowError(
                index, f"{where} has {role_key}={turn.get(role_key)!r}; use one of {allowed}"
            )
        content = turn.get(content_key)
        if not isinstance(content, str):
            raise BadRowError(
                index,
                f"{where} ({role}) {content_key} must be a string, got {type(content).__name__}",
            )
        if not content.strip():
            raise BadRowError(index, f"{where} ({role}) has empty {content_key}")
        extra = {
            k: v
            for k, v in turn.items()
            if k not in ("role", "content", "from", "value") and v is not None
        }
        out.append({**extra, "role": role, "content": content})
    if need_assistant and not any(m["role"] == "assistant" for m in out):
        raise BadRowError(index, f"`{field}` has no assistant turn, so nothing would be supervised")
    return out


def normalize_row(row: Mapping, index: int, need_assistant: bool = True) -> list[dict] | str:
    """Return the row's chat messages (list of {role, content, ...}) or its plain text (str).

    Precedence: `messages`, then `conversations`, then `text` (the first one that is not None), so a
    file that mixes chat and text rows (Arrow fills the missing column with None) works.
    Raises BadRowError naming `index` for anything malformed, including (with `need_assistant`) a
    conversation without an assistant turn.
    """
    if not isinstance(row, Mapping):
        raise BadRowError(index, f"expected a dict, got {type(row).__name__}")
    if row.get("messages") is not None:
        return _messages(row["messages"], index, False, need_assistant)
    if row.get("conversations") is not None:
        return _messages(row["conversations"], index, True, need_assistant)
    text = row.get("text")
    if text is not None:
        if not isinstance(text, str):
            raise BadRowError(index, f"`text` must be a string, got {type(text).__name__}")
        if not text.strip():
            raise BadRowError(index, "`text` is empty")
        return text
    raise BadRowError(
        index, f"no `messages`, `conversations` or `text` field (keys: {sorted(row)})"
    )
