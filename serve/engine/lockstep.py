"""Serving with `EngineOptions.tp > 1`: one `Engine` per rank of a torch.distributed world,
driven by rank 0.

Design choices:
- Batch-sharded sampling runs collectives inside `Engine.step`, so every rank must step the same
  requests in the same order. Rank 0 (the HTTP server) drives a `Lockstep`: each add/abort it
  applies is logged and broadcast with the next step; the other ranks run `follow`, which
  replays the log and steps. Models and schedulers are replicated, so the ranks stay identical
  (vLLM's driver-worker split, without a separate scheduler process).
- Only adds the engine accepted are logged: a bad request raises on rank 0 and never reaches a
  follower.
- An idle rank 0 sends an empty message every `KEEPALIVE_S`: a follower waits inside a
  collective, and gloo/NCCL end such a wait at the process group's timeout (30 min by default).
- `join_tp_world` is the entry points' one check: the world already initialised, or one made
  from torchrun's environment, of exactly `tp` ranks; else an `OptionsError` that says how to
  launch.
"""

from __future__ import annotations

import logging
import os
import time

import torch
import torch.distributed as dist

from serve.engine.engine import Engine
from serve.engine.options import OptionsError
from serve.engine.request import RequestOutput, SamplingParams

logger = logging.getLogger("serve.engine")
KEEPALIVE_S = 60.0
# torchrun sets these for every rank (MASTER_ADDR/MASTER_PORT name the rendezvous).
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def join_tp_world(tp: int, device: str) -> bool:
    """Make sure a torch.distributed world of `tp` ranks exists for the engine: the one already
    initialised, or one initialised here from torchrun's environment (gloo on CPU, NCCL on CUDA,
    each rank on its LOCAL_RANK GPU). Returns True when it initialised the world (the caller
    destroys it), False when there was nothing to do."""
    if tp == 1:
        return False
    how = (
        f"start {tp} ranks with torchrun --nproc-per-node {tp} (-m serve.api ... --tp {tp}, or "
        f"-m serve.launch engine=embedded tensor_parallel_size={tp} ...)"
    )
    if dist.is_initialized():
        if dist.get_world_size() != tp:
            raise OptionsError(
                f"tp={tp}, but the torch.distributed world has {dist.get_world_size()} ranks; "
                f"{how}."
            )
        return False
    missing = [k for k in TORCHRUN_ENV if k not in os.environ]
    if missing:
        raise OptionsError(
            f"tp={tp} needs a torch.distributed world of {tp} ranks; none is initialised and "
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} unset ({how})."
        )
    world = int(os.environ["WORLD_SIZE"])
    if world != tp:
        raise OptionsError(f"tp={tp}, but torchrun started WORLD_SIZE={world} ranks; {how}.")
    backend = "gloo"
    if device.startswith("cuda"):
        backend = "nccl"
        if device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend)
    return True


class Lockstep:
    """Rank 0's handle on a tp engine: the engine's driving methods (`add_request`,
    `abort_request`, `step`, `has_unfinished`; other attributes read through), with every
    accepted add/abort sent to the followers ahead of the step that follows it."""

    def __init__(self, engine: Engine):
        if dist.get_rank() != 0:
            raise RuntimeError("Lockstep drives from rank 0; the other ranks run follow()")
        self.engine = engine
        self._log: list[tuple] = []
        self._last_sent = time.monotonic()

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def add_request(self, prompt_ids: list[int], params: SamplingParams, request_id: str) -> str:
        self.engine.add_request(prompt_ids, params, request_id)  # raises before it is logged
        self._log.append(("add", prompt_ids, params, request_id))
        return request_id

    def abort_request(self, request_id: str, cause: str = "abort") -> bool:
        self._log.append(("abort", request_id, cause))
        return self.engine.abort_request(request_id, cause)

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()

    def step(self) -> list[RequestOutput]:
        self._send((self._log, True))
        self._log = []
        return self.engine.step()

    def keepalive(self) -> None:
        """Called while idle: an empty message when the followers have waited KEEPALIVE_S."""
        if time.monotonic() - self._last_sent > KEEPALIVE_S:
            self._send(([], False))

    def close(self) -> None:
        """Release the followers (their `follow` returns) and wait until each has the message:
        a rank that tore its process group down while a follower still read the close message's
        second broadcast made that follower abort ("terminate called without an active
        exception", seen 2026-12-05). Under torchrun a Ctrl-C reaches every rank at once, so the
        followers may be gone already: said, not raised."""
        try:
            self._send(None)
            dist.barrier()  # follow() meets it once the close message is in
        except RuntimeError as e:  # gloo/NCCL: the peer closed the connection
            logger.info("tp followers already gone at shutdown: %s", str(e).splitlines()[0])

    def _send(self, message) -> None:
        dist.broadcast_object_list([message], src=0)
        self._last_sent = time.monotonic()


def follow(engine: Engine) -> int:
    """A rank > 0: replay rank 0's adds/aborts and step with it until it closes; returns the
    number of steps run."""
    steps = 0
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0)
        if box[0] is None:
            dist.barrier()  # Lockstep.close waits here before anyone tears the world down
            return steps
        log, step = box[0]
        for op in log:
            if op[0] == "add":
                engine.add_request(op[1], op[2], op[3])
            else:
                engine.abort_request(*op[1:])
        if step:
            engine.step()
            steps += 1
