"""`Scheduler`: FCFS admission into a fixed number of KV slots (continuous batching).

Between rounds, waiting requests take free slots (lowest first, so running rows stay mostly
contiguous and the caches are read through views, not gathers) up to `max_num_seqs`; a finished
or aborted request frees its slot at once. No preemption: a request admitted runs to the end,
which the slot capacity (max_model_len plus one round of drafts) always allows.
"""

from __future__ import annotations

import heapq
from collections import deque

from serve.engine.request import Request, Status


class Scheduler:
    def __init__(self, max_num_seqs: int):
        self.waiting: deque[Request] = deque()
        self.running: dict[int, Request] = {}  # slot -> request
        self._free = list(range(max_num_seqs))
        heapq.heapify(self._free)

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def admit(self) -> list[Request]:
        """Move waiting requests into free slots; returns them ordered by slot."""
        new = []
        while self.waiting and self._free:
            req = self.waiting.popleft()
            req.slot = heapq.heappop(self._free)
            req.status = Status.RUNNING
            self.running[req.slot] = req
            new.append(req)
        return sorted(new, key=lambda r: r.slot)

    def running_by_slot(self) -> list[Request]:
        return [self.running[s] for s in sorted(self.running)]

    def finish(self, req: Request, reason: str) -> None:
        """Mark finished and release its slot (or drop it from the waiting queue)."""
        if req.status is Status.RUNNING:
            del self.running[req.slot]
            heapq.heappush(self._free, req.slot)
        elif req.status is Status.WAITING:
            self.waiting.remove(req)
        req.status, req.finish_reason = Status.FINISHED, reason

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    @property
    def num_free_slots(self) -> int:
        """Slots on the free list: max_num_seqs whenever nothing runs, unless one leaked."""
        return len(self._free)
