"""The prompt file smollm2_regenerate.sh hands train.prepare.regenerate: held-out prompts once,
then the
train prompts once per sample, each row tagged with its split; a prompt (all but the answer
train.prepare.regenerate replaces) longer than --max-prompt-tokens is dropped and counted, so
prompt plus
512 new tokens fits the trainer's seq_len of 2048.

    python3 lab/gpu/regen_prompts.py --target artifacts/smollm2-135m-instruct \
        --data-dir artifacts/smollm2-data [--suffix .later] [--samples K] [--extra NAME]
        [--extra-only] [--json FILE]

It reads DATA_DIR/sharegpt-{heldout,train}SUFFIX.jsonl (prepare_carry.sh: SUFFIX '' for the first
turns, '.later' for each chat's later ones) and writes DATA_DIR/prompts.jsonl. `--extra NAME`
(repeatable) adds DATA_DIR/NAME-train.jsonl's prompts to the train ones, spread evenly among
them, so a regeneration cut by its time budget keeps each source's share (pystdlib, pypackages:
code prompts, train/data/pystdlib.py and pypackages.py); `--extra-only` writes those alone (no
ShareGPT prompts, none held out). With the same files and options the output is the same row for
row, which a resumed regeneration relies on.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from train.data.regenerate import regeneration_prompt  # noqa: E402

SPLITS = ("heldout", "train")  # held-out first: a cut run still holds every held-out prompt


def build(
    tokenizer,
    data_dir: Path,
    suffix: str,
    samples: int,
    max_tokens: int,
    extra=(),
    extra_only: bool = False,
) -> dict:
    kept, dropped, rows = {"heldout": 0}, {"heldout": 0}, {"heldout": []}
    sources = {} if extra_only else {s: data_dir / f"sharegpt-{s}{suffix}.jsonl" for s in SPLITS}
    sources.update({name: data_dir / f"{name}-train.jsonl" for name in extra})
    for source, path in sources.items():
        rows[source] = []
        kept[source] = dropped[source] = 0
        split = "heldout" if source == "heldout" else "train"
        for line in path.open(encoding="utf-8"):
            row = json.loads(line)
            ids = tokenizer.apply_chat_template(
                regeneration_prompt(row), add_generation_prompt=True, return_dict=True
            )["input_ids"]
            if len(ids) > max_tokens:
                dropped[source] += 1
                continue
            kept[source] += 1
            rows[source].append({**row, "split": split})
    train = spread([rows[s] for s in sources if s != "heldout"])
    with (data_dir / "prompts.jsonl").open("w", encoding="utf-8") as out:
        for row in rows["heldout"]:
            out.write(json.dumps(row) + "\n")
        for _ in range(samples):
            for row in train:
                out.write(json.dumps(row) + "\n")
    return {
        "suffix": suffix,
        "samples": samples,
        "extra": list(extra),
        "extra_only": extra_only,
        "max_prompt_tokens": max_tokens,
        "kept": kept,
        "dropped_longer": dropped,
        "rows_written": kept["heldout"] + samples * len(train),
    }


def spread(lists: list[list]) -> list:
    """The lists' items as one, each list's spread evenly over it (item i of a list of n sits at
    (i + 0.5) / n of the way), the first list's first on ties; each list keeps its order."""
    keyed = [((i + 0.5) / len(xs), k, i) for k, xs in enumerate(lists) for i in range(len(xs))]
    return [lists[k][i] for _, k, i in sorted(keyed)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="HF folder with the target's tokenizer")
    ap.add_argument("--data-dir", required=True, type=Path)
    ap.add_argument("--suffix", default="", help="'' (first turns) or '.later'")
    ap.add_argument("--samples", type=int, default=1, help="answers per train prompt")
    ap.add_argument(
        "--extra", action="append", default=[], help="also DATA_DIR/NAME-train.jsonl (repeatable)"
    )
    ap.add_argument(
        "--extra-only",
        action="store_true",
        help="only the --extra prompts (all train), no ShareGPT ones: e.g. code answers alone",
    )
    ap.add_argument("--max-prompt-tokens", type=int, default=1536)
    ap.add_argument("--json", help="also write the counts here")
    a = ap.parse_args(argv)
    if a.samples < 1:
        ap.error("--samples must be at least 1")
    if a.extra_only and not a.extra:
        ap.error("--extra-only needs at least one --extra NAME")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.target)
    missing = [n for n in a.extra if not (a.data_dir / f"{n}-train.jsonl").is_file()]
    if missing:
        ap.error(f"--extra {missing}: no {a.data_dir}/NAME-train.jsonl (train.prepare.data NAME)")
    counts = build(tok, a.data_dir, a.suffix, a.samples, a.max_prompt_tokens, a.extra, a.extra_only)
    print(
        f"prompts kept {counts['kept']}, dropped as longer than {a.max_prompt_tokens} tokens "
        f"{counts['dropped_longer']}; {a.samples} answers per train prompt"
    )
    if a.json:
        Path(a.json).write_text(json.dumps(counts, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
