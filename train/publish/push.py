"""Push an exported DSpark checkpoint to the Hugging Face Hub.

    python -m train.publish.push CKPT_DIR --repo-id ORG/NAME [--private] [--token T] [--endpoint
    URL]
        [--commit-message M] [--allow-no-card] [--attempts N] [--dry-run]

Design choices:
- Everything that can be checked locally is checked before the first request, and every problem is
  reported at once (exit 2): the vLLM contract (`common.contract.check_checkpoint`, since vLLM's
  loader accepts a broken draft silently), the model card, the repo id and offline mode. A refused
  push sends nothing.
- `HF_HUB_OFFLINE=1` (or `TRANSFORMERS_OFFLINE=1`) is a refusal with the fix, not a stack trace:
  huggingface_hub would otherwise fail deep inside the upload.
- Only `HfApi.create_repo(exist_ok=True)`, `list_repo_tree` and `create_commit`, which exist with
  the same signatures in huggingface_hub 1.x and 2.x. `private` is sent only when asked for, so a
  new repo otherwise gets the namespace's default visibility; an existing repo keeps its own.
- Resumable and verified: the remote tree's hashes (git blob sha1, or sha256 for LFS files) are
  compared with the local files; only missing or different files are committed, and the push
  reports success only once a fresh listing shows every local file with its local hash.
- Transient failures (network errors, HTTP 408/429/5xx, a listing that does not match yet) are
  retried `attempts` times in all with exponential backoff (`backoff_s`, doubling, capped at
  `max_backoff_s`; `sleep` is injectable for tests). Each retry re-lists first, so files that
  landed before an interruption are not sent again.
- `--dry-run` runs the same local checks and lists the files a push would upload, their sizes and
  the repo URL, without a single request (so it works offline): a real push then sends only those
  the repo lacks or holds with other bytes.
- A file that cannot be read (a truncated model.safetensors, a config.json that is not JSON) is a
  refusal line like any other (`common.checkpoint_errors.CheckpointFileError`), not a traceback.
- Remote failures that retrying cannot fix (auth, permissions, other Hub errors) become `PushFailed`
  at once with one line saying what to change (exit 1). The token is never printed.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

from common.checkpoint import PROVENANCE_NAME
from common.checkpoint_errors import CheckpointFileError
from common.contract import check_checkpoint
from train.publish.model_card import CARD_NAME

# Hidden files are never pushed: temp files of an interrupted write (`.README.md.tmp-*`), editor
# droppings, `.ipynb_checkpoints`. (huggingface_hub matches with fnmatch: `*` spans `/`.)
IGNORE_PATTERNS = [".*", "*/.*", "*__pycache__*"]
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
_OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
RETRY_STATUS = {408, 429, 500, 502, 503, 504}


class PushRefused(ValueError):
    """Local problems found before any request was sent; `problems` lists every one."""

    def __init__(self, ckpt_dir: str | os.PathLike, problems: list[str]):
        self.problems = problems
        super().__init__(f"refusing to push {ckpt_dir}:\n  - " + "\n  - ".join(problems))


class PushFailed(RuntimeError):
    """The Hub (or the network) rejected the push; the message says what to change."""


def _is_true(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def offline_problem() -> str | None:
    """Why huggingface_hub would refuse to send requests, with the fix; None when online."""
    from huggingface_hub import constants

    set_vars = [v for v in _OFFLINE_VARS if _is_true(os.environ.get(v))]
    if set_vars:
        names = " and ".join(f"{v}={os.environ[v]}" for v in set_vars)
        unset = " ".join(f"-u {v}" for v in set_vars)
        return (
            f"{names} is set, so huggingface_hub sends no requests: unset it for this command "
            f"(e.g. `env {unset} python -m train.publish.push ...`)"
        )
    if getattr(constants, "HF_HUB_OFFLINE", False):
        # huggingface_hub reads the variable once, at import: unsetting it later changes nothing.
        return (
            "huggingface_hub was imported while HF_HUB_OFFLINE was set and stays offline: unset "
            "HF_HUB_OFFLINE before starting Python"
        )
    return None


def preflight(
    ckpt_dir: str | os.PathLike, repo_id: str, allow_no_card: bool = False, offline_ok=False
) -> list[str]:
    """Every local reason not to push, one line each (empty = go); `offline_ok`: leave out offline
    mode (a dry run sends nothing)."""
    ckpt = Path(ckpt_dir)
    problems = []
    if not _REPO_ID.match(repo_id or ""):
        problems.append(
            f"--repo-id {repo_id!r}: give ORG/NAME (a user or organisation, a slash, a name of "
            "letters, digits, '-', '_' or '.')"
        )
    if not ckpt.is_dir():
        problems.append(f"{ckpt} is not a directory")
    else:
        problems += _contract_problems(ckpt)
        if not allow_no_card and not (ckpt / CARD_NAME).is_file():
            problems.append(
                f"{ckpt / CARD_NAME} (model card) is missing: write it with "
                "train.publish.model_card.write_model_card, or pass --allow-no-card"
            )
    offline = None if offline_ok else offline_problem()
    if offline:
        problems.append(offline)
    return problems


def _contract_problems(ckpt: Path) -> list[str]:
    try:
        return [f"contract: {p}" for p in check_checkpoint(ckpt)]
    except CheckpointFileError as e:  # config.json unreadable where the contract reads it
        return [str(e)]


def dry_run(
    ckpt_dir: str | os.PathLike,
    repo_id: str,
    private: bool = False,
    endpoint: str | None = None,
    allow_no_card: bool = False,
) -> list[str]:
    """What `push_checkpoint` would upload and where, as lines to print; sends nothing. Raises
    `PushRefused` for the problems a real push would refuse on (offline mode aside)."""
    problems = preflight(ckpt_dir, repo_id, allow_no_card, offline_ok=True)
    if problems:
        raise PushRefused(ckpt_dir, problems)
    from huggingface_hub import constants

    ckpt = Path(ckpt_dir)
    files = list(local_file_hashes(ckpt, hashes=False))
    sizes = {rel: (ckpt / rel).stat().st_size for rel in files}
    url = f"{(endpoint or constants.ENDPOINT).rstrip('/')}/{repo_id}"
    visibility = "private" if private else "the namespace's default visibility"
    lines = [
        f"dry run: would push {len(files)} files ({_size(sum(sizes.values()))}) from {ckpt} to "
        f"{url} (created if new, {visibility}); nothing was sent",
        *(f"  {rel}  {_size(sizes[rel])}" for rel in files),
        "a real push sends only the files the repo lacks or holds with other bytes",
    ]
    offline = offline_problem()
    if offline:
        lines.append(f"note: {offline}")
    return lines


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def push_checkpoint(
    ckpt_dir: str | os.PathLike,
    repo_id: str,
    private: bool = False,
    token: str | None = None,
    endpoint: str | None = None,
    commit_message: str | None = None,
    allow_no_card: bool = False,
    attempts: int = 5,
    backoff_s: float = 2.0,
    max_backoff_s: float = 60.0,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Create `repo_id` (if needed), upload what the Hub lacks, verify every hash; returns the URL.

    Raises `PushRefused` (nothing sent) or `PushFailed` (the Hub or network said no, or the files
    did not all land within `attempts` tries). `token`/`endpoint` default to huggingface_hub's own
    (HF_TOKEN, `hf auth login`, HF_ENDPOINT).
    """
    problems = preflight(ckpt_dir, repo_id, allow_no_card)
    if problems:
        raise PushRefused(ckpt_dir, problems)
    if attempts < 1:
        raise ValueError(f"attempts={attempts}: must be >= 1")
    from huggingface_hub import CommitOperationAdd, HfApi

    ckpt = Path(ckpt_dir)
    api = HfApi(endpoint=endpoint, token=token)
    local = local_file_hashes(ckpt)
    message = commit_message or _default_commit_message(ckpt)
    url, missing = None, sorted(local)
    for attempt in range(1, attempts + 1):
        try:
            if url is None:
                url = api.create_repo(
                    repo_id, repo_type="model", private=True if private else None, exist_ok=True
                )
            todo = unmatched(local, remote_file_hashes(api, repo_id))
            if todo:
                api.create_commit(
                    repo_id=repo_id,
                    repo_type="model",
                    operations=[
                        CommitOperationAdd(path_in_repo=p, path_or_fileobj=str(ckpt / p))
                        for p in todo
                    ],
                    commit_message=message,
                )
            missing = unmatched(local, remote_file_hashes(api, repo_id))
            if not missing:
                return str(url)
            why = f"after the upload the Hub lacks or differs on {missing}"
        except Exception as e:
            if not _retryable(e):
                raise PushFailed(_explain(e, repo_id, api.endpoint)) from e
            why = _explain(e, repo_id, api.endpoint)
        if attempt < attempts:
            delay = min(max_backoff_s, backoff_s * 2 ** (attempt - 1))
            print(
                f"[push] attempt {attempt}/{attempts} failed: {why}; retrying in {delay:.1f}s",
                file=sys.stderr,
            )
            sleep(delay)
    raise PushFailed(
        f"push of {repo_id} to {api.endpoint} did not complete in {attempts} attempts: {why}. "
        "Run the same command again: files that landed with matching hashes are not re-sent."
    )


def _ignored(rel: str) -> bool:
    return any(fnmatch.fnmatch(rel, pat) for pat in IGNORE_PATTERNS)


def local_file_hashes(ckpt: Path, hashes: bool = True) -> dict[str, tuple[str, str] | None]:
    """path in repo -> (git blob sha1, sha256) of every file that is pushed (None without
    `hashes`)."""
    out = {}
    for f in sorted(ckpt.rglob("*")):
        rel = f.relative_to(ckpt).as_posix()
        if f.is_file() and not _ignored(rel):
            if not hashes:
                out[rel] = None
                continue
            data = f.read_bytes()
            blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            out[rel] = (blob, hashlib.sha256(data).hexdigest())
    return out


def remote_file_hashes(api, repo_id: str) -> dict[str, tuple[str, str | None]]:
    """path -> (git blob id, LFS sha256 or None) of the repo's main branch."""
    from huggingface_hub.hf_api import RepoFile

    out = {}
    for entry in api.list_repo_tree(repo_id, repo_type="model", recursive=True):
        if isinstance(entry, RepoFile):
            lfs = entry.lfs.sha256 if entry.lfs is not None else None
            out[entry.path] = (entry.blob_id, lfs)
    return out


def unmatched(local: dict, remote: dict) -> list[str]:
    """Local files the remote lacks or holds with another hash."""
    bad = []
    for path, (blob, sha256) in local.items():
        got = remote.get(path)
        if got is None or (got[1] != sha256 if got[1] is not None else got[0] != blob):
            bad.append(path)
    return bad


def _retryable(e: Exception) -> bool:
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(e, HfHubHTTPError):
        return getattr(e.response, "status_code", None) in RETRY_STATUS
    return isinstance(e, _transport_errors())


def _default_commit_message(ckpt: Path) -> str:
    try:
        sha = json.loads((ckpt / PROVENANCE_NAME).read_text()).get("git_sha")
    except (OSError, json.JSONDecodeError):
        sha = None
    return "Upload DSpark draft" + (f" (dspark {sha[:12]})" if sha else "")


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Connection-level exceptions of the HTTP client huggingface_hub uses (httpx in 1.x, httpx2
    in 2.x)."""
    errors: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module in ("httpx", "httpx2"):
        try:
            errors.append(__import__(module).TransportError)
        except (ImportError, AttributeError):
            pass
    return tuple(errors)


def _explain(e: Exception, repo_id: str, endpoint: str) -> str:
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    if isinstance(e, OfflineModeIsEnabled):
        return f"huggingface_hub is in offline mode: {offline_problem() or e}"
    if isinstance(e, HfHubHTTPError):
        status = getattr(e.response, "status_code", None)
        detail = str(e).splitlines()[0]
        if status == 401:
            return (
                f"authentication failed at {endpoint} (401): the token is missing, invalid or "
                "expired. Pass --token, set HF_TOKEN, or run `hf auth login`."
            )
        if status == 403:
            namespace = repo_id.split("/")[0]
            return (
                f"permission denied at {endpoint} (403): the token cannot write to {repo_id}. "
                f"Use a token with write access and check that you belong to '{namespace}'."
            )
        return f"the Hub at {endpoint} refused the push of {repo_id} ({status}): {detail}"
    if isinstance(e, _transport_errors()):
        return (
            f"could not reach {endpoint} ({type(e).__name__}: {e}). Check the network, proxy, "
            "--endpoint or HF_ENDPOINT."
        )
    if isinstance(e, ValueError) and "README.md" in str(e):
        return f"the Hub rejected the model card front matter: {e}"
    return f"push of {repo_id} to {endpoint} failed: {type(e).__name__}: {e}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m train.publish.push",
        description="Validate an exported DSpark checkpoint and upload it to the Hugging Face Hub.",
    )
    p.add_argument(
        "ckpt_dir", help="checkpoint folder written by common.checkpoint.save_checkpoint"
    )
    p.add_argument("--repo-id", required=True, help="ORG/NAME of the model repo (created if new)")
    p.add_argument("--private", action="store_true", help="create the repo private")
    p.add_argument("--token", default=None, help="Hub token (default: HF_TOKEN or `hf auth login`)")
    p.add_argument("--endpoint", default=None, help="Hub URL (default: HF_ENDPOINT or the Hub)")
    p.add_argument("--commit-message", default=None)
    p.add_argument(
        "--allow-no-card", action="store_true", help="push even without a README.md model card"
    )
    p.add_argument(
        "--attempts", type=int, default=5, help="tries in all for transient failures (backoff)"
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check, then list what would be uploaded and where; send nothing",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        try:
            lines = dry_run(
                args.ckpt_dir, args.repo_id, args.private, args.endpoint, args.allow_no_card
            )
        except PushRefused as e:
            print(e, file=sys.stderr)
            return 2
        print("\n".join(lines))
        return 0
    try:
        url = push_checkpoint(
            args.ckpt_dir,
            args.repo_id,
            private=args.private,
            token=args.token,
            endpoint=args.endpoint,
            commit_message=args.commit_message,
            allow_no_card=args.allow_no_card,
            attempts=args.attempts,
        )
    except PushRefused as e:
        print(e, file=sys.stderr)
        return 2
    except PushFailed as e:
        print(f"push failed: {e}", file=sys.stderr)
        return 1
    print(f"pushed {args.ckpt_dir} to {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
