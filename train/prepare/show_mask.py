"""Show which tokens of a sample are supervised: the quickest check of a chat template's mask.

    python -m train.prepare.show_mask --tokenizer PATH --data FILE [--row N] [--seq-len L]

Without --seq-len, row N of the data is rendered alone. With --seq-len, the first --max-rows rows
are packed to L tokens (as training would) and packed row N is shown, documents split by a `‖` line.
Supervised spans are green on a terminal and wrapped in [[...]] otherwise (--color to force).
Exit status 2 for a bad tokenizer, template or row.
"""

import argparse
import json
import sys

GREEN, RESET = "\x1b[42;30m", "\x1b[0m"


def mark(tokenizer, ids, mask, color: bool) -> str:
    """Decode `ids`, marking maximal runs where `mask` is True."""
    out, start = [], 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or mask[i] != mask[start]:
            text = tokenizer.decode(ids[start:i])
            if mask[start]:
                text = f"{GREEN}{text}{RESET}" if color else f"[[{text}]]"
            out.append(text)
            start = i
    return "".join(out)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m train.prepare.show_mask", description=__doc__.split("\n")[0]
    )
    p.add_argument("--tokenizer", required=True, help="target tokenizer path (or cached hub id)")
    p.add_argument("--data", required=True, help="data file/dir/hub id, as data.source")
    p.add_argument("--row", type=int, default=0, help="row (or packed row with --seq-len) to show")
    p.add_argument("--seq-len", type=int, default=None, help="pack to this length and show a row")
    p.add_argument("--packing", choices=("pack", "bucket"), default="pack")
    p.add_argument("--max-rows", type=int, default=1000, help="rows to pack with --seq-len")
    p.add_argument("--chat-template", default=None, help="override template (.jinja file)")
    p.add_argument(
        "--chat-template-kwargs",
        type=json.loads,
        default={},
        help='template options as JSON (data.chat_template_kwargs): {"enable_thinking": false}',
    )
    p.add_argument("--split", default=None)
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    return p


def _show(args, tokenizer) -> str:
    from train.data import Renderer, build_dataset, load_rows

    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    if args.seq_len is None:
        rows = load_rows(args.data, args.split)
        if not 0 <= args.row < len(rows):
            raise IndexError(f"--row {args.row} out of range: the data has {len(rows)} rows")
        r = Renderer(tokenizer, args.chat_template, args.chat_template_kwargs, drop_bad_turns=True)
        rendered = r.render(rows[args.row], args.row)
        ids, mask = rendered.ids, rendered.mask
        body, total = mark(tokenizer, ids, mask, color), len(ids)
        notes = f" [{', '.join(rendered.notes)}]" if rendered.notes else ""
        head = f"row {args.row}{notes}"
    else:
        rows = load_rows(args.data, args.split, max_rows=args.max_rows)
        packed = build_dataset(
            rows,
            tokenizer,
            args.seq_len,
            packing=args.packing,
            chat_template=args.chat_template,
            template_kwargs=args.chat_template_kwargs,
        )
        if not 0 <= args.row < len(packed):
            raise IndexError(f"--row {args.row} out of range: {len(packed)} packed rows")
        r = packed[args.row]
        docs = [d for d in sorted(set(r["doc_ids"])) if d >= 0]
        parts = []
        for d in docs:
            at = [i for i, x in enumerate(r["doc_ids"]) if x == d]
            ids = [r["input_ids"][i] for i in at]
            parts.append(mark(tokenizer, ids, [r["loss_mask"][i] for i in at], color))
        mask, total = r["loss_mask"], sum(x >= 0 for x in r["doc_ids"])
        body = "\n‖\n".join(parts)
        head = f"packed row {args.row} ({len(docs)} docs, {args.seq_len - total} padding)"
    supervised = sum(map(bool, mask))
    frac = supervised / max(total, 1)
    return f"{head}: {total} tokens, {supervised} supervised ({frac:.1%})\n{body}"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from transformers import AutoTokenizer

    from train.data import BadDataShare, BadRowError, ChatTemplateError

    try:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        print(_show(args, tokenizer))
    except (
        BadRowError,
        BadDataShare,
        ChatTemplateError,
        IndexError,
        FileNotFoundError,
        OSError,
    ) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
