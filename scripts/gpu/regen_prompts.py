"""The prompt file smollm2_regenerate.sh hands train.regenerate: held-out prompts once, then the
train prompts once per sample, each row tagged with its split; a prompt (all but the answer
train.regenerate replaces) longer than --max-prompt-tokens is dropped and counted, so prompt plus
512 new tokens fits the trainer's seq_len of 2048.

    python3 scripts/gpu/regen_prompts.py --target artifacts/smollm2-135m-instruct \
        --data-dir artifacts/smollm2-data [--suffix .later] [--samples K] [--json FILE]

It reads DATA_DIR/sharegpt-{heldout,train}SUFFIX.jsonl (prepare_carry.sh: SUFFIX '' for the first
turns, '.later' for each chat's later ones) and writes DATA_DIR/prompts.jsonl. With the same files
and --samples the output is the same row for row, which a resumed regeneration relies on.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from train.data.regenerate import regeneration_prompt  # noqa: E402

SPLITS = ("heldout", "train")  # held-out first: a cut run still holds every held-out prompt


def build(tokenizer, data_dir: Path, suffix: str, samples: int, max_tokens: int) -> dict:
    kept, dropped, rows = {}, {}, {}
    for split in SPLITS:
        rows[split] = []
        kept[split] = dropped[split] = 0
        for line in (data_dir / f"sharegpt-{split}{suffix}.jsonl").open(encoding="utf-8"):
            row = json.loads(line)
            ids = tokenizer.apply_chat_template(
                regeneration_prompt(row), add_generation_prompt=True, return_dict=True
            )["input_ids"]
            if len(ids) > max_tokens:
                dropped[split] += 1
                continue
            kept[split] += 1
            rows[split].append({**row, "split": split})
    with (data_dir / "prompts.jsonl").open("w", encoding="utf-8") as out:
        for row in rows["heldout"]:
            out.write(json.dumps(row) + "\n")
        for _ in range(samples):
            for row in rows["train"]:
                out.write(json.dumps(row) + "\n")
    return {
        "suffix": suffix,
        "samples": samples,
        "max_prompt_tokens": max_tokens,
        "kept": kept,
        "dropped_longer": dropped,
        "rows_written": kept["heldout"] + samples * kept["train"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="HF folder with the target's tokenizer")
    ap.add_argument("--data-dir", required=True, type=Path)
    ap.add_argument("--suffix", default="", help="'' (first turns) or '.later'")
    ap.add_argument("--samples", type=int, default=1, help="answers per train prompt")
    ap.add_argument("--max-prompt-tokens", type=int, default=1536)
    ap.add_argument("--json", help="also write the counts here")
    a = ap.parse_args(argv)
    if a.samples < 1:
        ap.error("--samples must be at least 1")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.target)
    counts = build(tok, a.data_dir, a.suffix, a.samples, a.max_prompt_tokens)
    print(
        f"prompts kept {counts['kept']}, dropped as longer than {a.max_prompt_tokens} tokens "
        f"{counts['dropped_longer']}; {a.samples} answers per train prompt"
    )
    if a.json:
        Path(a.json).write_text(json.dumps(counts, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
