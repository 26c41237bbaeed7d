"""ShareGPT JSON (a possibly truncated array of `{id, conversations: [{from, value}]}`) -> clean
chat rows `{"id", "messages": [{role, content}]}` split into train / heldout, with a report of
what was kept and dropped, and why.

Design choices:
- Truncation: the packaged file is cut mid-object, so `json.load` fails. We decode the array object
  by object (`json.JSONDecoder.raw_decode`) and keep the complete prefix; the first object that
  does not decode is the truncated tail (counted, with the bytes discarded). A decode error in a
  file whose array is closed would be corruption, not truncation: that is an error.
- Roles: human/user -> user, gpt/chatgpt/bing/bard/assistant -> assistant, system -> system
  (rows.SHAREGPT_ROLES plus the other assistants ShareGPT names). A turn with another role, or
  empty / non-string text, is skipped and counted per reason.
- A conversation is kept when what remains is: at most one leading system turn, then user and
  assistant alternating, starting with user, with at least one assistant turn. A trailing user turn
  (a question without an answer) is trimmed and counted. Otherwise it is dropped with the first
  reason that applies (DROP_REASONS). A repeated id keeps its first kept occurrence.
- Split: by the *base* id (the part before ShareGPT's `_N` chunk suffix, so the chunks of one long
  chat land on the same side): heldout iff sha256(f"{seed}:{base_id}") read as a fraction of 2**64
  is below `heldout_fraction` (default 2%). Stable per id: adding or removing other conversations
  never moves one across the split.
- `turns`: which rows a kept conversation gives.
  - `all` (default): one row, every turn; the trainer learns every assistant turn.
  - `first`: one row, the (system,) first user turn and its answer: the prompt the target is asked
    to answer again when responses are regenerated on-policy.
  - `each`: one row per answered user turn, the conversation up to and including that answer, so
    regeneration asks the target to answer every turn, not only the first: on the package's file
    36,477 train prompts instead of 10,893. The earlier answers in a row's context stay ShareGPT's
    own; only the last is regenerated. The first row keeps the conversation's id and equals its
    `first` row, so answers regenerated for `first` rows carry over; the K-th answer's row (K >= 1)
    is `ID#K`. All rows of one conversation fall on the same side of the split (the
    conversation's id decides it).
  - `later`: the rows of `each` that `first` leaves out (a conversation's second answer on), so a
    session that regenerated the first turns can answer the rest under another name.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from dataclasses import dataclass, field

from train.data.rows import SHAREGPT_ROLES

ROLE_MAP = {
    **{k: v for k, v in SHAREGPT_ROLES.items() if v in ("system", "user", "assistant")},
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
}
DROP_REASONS = (
    "truncated_tail",  # the incomplete object where the file is cut
    "malformed",  # not {id: str, conversations: list}
    "duplicate_id",
    "no_turns",  # nothing left after skipping empty / unknown-role turns
    "first_turn_not_user",  # e.g. a chunk that starts with the assistant's continuation
    "not_alternating",  # two user or two assistant turns in a row, or a late system turn
    "fewer_than_two_turns",  # no assistant answer at all
)
TURNS = ("all", "first", "each", "later")
HELDOUT_FRACTION = 0.02
_CHUNK_SUFFIX = re.compile(r"_\d+$")


class ShareGPTError(ValueError):
    """The file is not a ShareGPT JSON array (or is corrupt before its end)."""


@dataclass
class Report:
    """Counts of what was kept and dropped, and why (printed by the CLI, saved as JSON)."""

    objects: int = 0  # complete objects decoded
    kept: int = 0  # conversations (each gives one row, or one per answer: turns=each|later)
    dropped: Counter = field(default_factory=Counter)  # reason -> conversations
    skipped_turns: Counter = field(default_factory=Counter)  # reason -> turns
    unknown_roles: Counter = field(default_factory=Counter)  # role name -> turns
    bytes_total: int = 0
    bytes_discarded: int = 0  # the truncated tail
    splits: dict = field(default_factory=dict)  # split -> rows

    def to_dict(self) -> dict:
        return {
            "objects_decoded": self.objects,
            "kept": self.kept,
            "dropped": {r: self.dropped[r] for r in DROP_REASONS if self.dropped[r]},
            "dropped_total": sum(self.dropped.values()),
            "skipped_turns": dict(sorted(self.skipped_turns.items())),
            "unknown_roles": dict(self.unknown_roles.most_common()),
            "bytes_total": self.bytes_total,
            "bytes_discarded": self.bytes_discarded,
            "splits": dict(self.splits),
        }


def iter_array_prefix(text: str, report: Report, progress: bool = False):
    """Yield the complete objects of a JSON array `text`, stopping at a truncated tail."""
    from tqdm import tqdm

    decoder, n = json.JSONDecoder(), len(text)
    report.bytes_total = n
    i = _skip_ws(text, 0)
    if i >= n or text[i] != "[":
        raise ShareGPTError("expected a JSON array (the file does not start with '[')")
    i = _skip_ws(text, i + 1)
    bar = tqdm(total=n, unit="B", unit_scale=True, desc="ShareGPT", disable=not progress)
    try:
        while i < n and text[i] != "]":
            try:
                obj, end = decoder.raw_decode(text, i)
            except json.JSONDecodeError as e:
                if text.rstrip().endswith("]"):
                    raise ShareGPTError(f"corrupt JSON at character {e.pos}: {e.msg}") from e
                report.dropped["truncated_tail"] += 1
                report.bytes_discarded = n - i
                return
            report.objects += 1
            bar.update(end - i)
            yield obj
            i = _skip_ws(text, end)
            if i < n and text[i] == ",":
                i = _skip_ws(text, i + 1)
            elif i < n and text[i] != "]":
                raise ShareGPTError(f"expected ',' or ']' at character {i}, got {text[i]!r}")
    finally:
        bar.close()


def _skip_ws(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in " \t\r\n":
        i += 1
    return i


def clean_conversation(obj, report: Report) -> list[dict] | None:
    """-> messages [{role, content}] of a kept conversation, or None (reason counted)."""
    turns = obj.get("conversations") if isinstance(obj, dict) else None
    if not isinstance(turns, list) or not isinstance(obj.get("id"), str):
        report.dropped["malformed"] += 1
        return None
    messages = []
    for turn in turns:
        speaker = turn.get("from") if isinstance(turn, dict) else None
        role = ROLE_MAP.get(speaker) if isinstance(speaker, str) else None
        value = turn.get("value") if isinstance(turn, dict) else None
        if role is None:
            report.skipped_turns["unknown_role"] += 1
            report.unknown_roles[str(speaker)] += 1
        elif not isinstance(value, str) or not value.strip():
            report.skipped_turns["empty"] += 1
        else:
            messages.append({"role": role, "content": value})
    reason = _drop_reason(messages)
    if reason is None and messages[-1]["role"] == "user":
        messages.pop()
        report.skipped_turns["trailing_user"] += 1
        reason = _drop_reason(messages)
    if reason is not None:
        report.dropped[reason] += 1
        return None
    return messages


def _drop_reason(messages: list[dict]) -> str | None:
    body = messages[1:] if messages and messages[0]["role"] == "system" else messages
    if not body:
        return "no_turns"
    if body[0]["role"] != "user":
        return "first_turn_not_user"
    for k, m in enumerate(body):
        if m["role"] != ("user", "assistant")[k % 2]:
            return "not_alternating"
    if len(body) < 2:
        return "fewer_than_two_turns"
    return None


def is_heldout(conv_id: str, seed: int, fraction: float) -> bool:
    base = _CHUNK_SUFFIX.sub("", conv_id)
    digest = hashlib.sha256(f"{seed}:{base}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def _rows(conv_id: str, messages: list[dict], turns: str) -> list[dict]:
    """The rows one clean conversation gives under `turns` (see the module docstring)."""
    if turns == "all":
        return [{"id": conv_id, "messages": messages}]
    ends = [i + 1 for i, m in enumerate(messages) if m["role"] == "assistant"]
    if turns == "first":
        ends = ends[:1]
    ids = [conv_id] + [f"{conv_id}#{k}" for k in range(1, len(ends))]
    rows = [{"id": i, "messages": messages[:end]} for i, end in zip(ids, ends)]
    return rows[1:] if turns == "later" else rows


def sharegpt_splits(
    text: str,
    *,
    turns: str = "all",
    seed: int = 0,
    heldout_fraction: float = HELDOUT_FRACTION,
    progress: bool = False,
) -> tuple[dict[str, list[dict]], Report]:
    """ShareGPT JSON text -> ({"train": rows, "heldout": rows}, report). See module docstring."""
    if turns not in TURNS:
        raise ValueError(f"turns={turns!r}: choose one of {list(TURNS)}")
    if not 0.0 <= heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction={heldout_fraction} must be in [0, 1)")
    report, seen = Report(), set()
    splits: dict[str, list[dict]] = {"train": [], "heldout": []}
    for obj in iter_array_prefix(text, report, progress):
        messages = clean_conversation(obj, report)
        if messages is None:
            continue
        if obj["id"] in seen:
            report.dropped["duplicate_id"] += 1
            continue
        seen.add(obj["id"])
        report.kept += 1
        side = "heldout" if is_heldout(obj["id"], seed, heldout_fraction) else "train"
        splits[side].extend(_rows(obj["id"], messages, turns))
    report.splits = {k: len(v) for k, v in splits.items()}
    return splits, report
