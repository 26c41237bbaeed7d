"""Stop a training run at a step boundary on SIGTERM or SIGINT, with its state saved.

Schedulers (SLURM, Kubernetes, torchrun's agent) send SIGTERM and wait a grace period before
SIGKILL; Ctrl-C sends SIGINT. Without a handler either one loses every step since the last
periodic checkpoint. With `StopSignals` installed around the loop:
- the first such signal only records itself (and says so on stderr); the trainer reads it in the
  step's one flags sync, summed over ranks, so every rank stops after the same step even when the
  signal reached one of them;
- the trainer then saves that step's checkpoint (marked LAST_GOOD), skips the evaluations still
  due and the export, and `train.distill` exits 128 + the signal's number (143 for SIGTERM, 130 for
  SIGINT, as a shell reports a process the signal killed); `resume=true` continues exactly;
- a second signal does what it would have done without this module (SIGINT raises
  KeyboardInterrupt, SIGTERM terminates), for a user who will not wait for the step to end.
Handlers are installed only in the main thread (Python allows no other) and the previous ones are
put back on exit. Data-loader workers forked meanwhile inherit them, so a Ctrl-C that reaches the
whole process group does not kill a worker under the trainer's feet (they record it silently).
"""

from __future__ import annotations

import os
import signal
import sys
import threading

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class RunStopped(Exception):
    """A run stopped by a signal after `step`, its state saved in `checkpoint`."""

    def __init__(self, signum: int, step: int, checkpoint) -> None:
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        self.exit_code = 128 + signum
        super().__init__(
            f"stopped by {signal.Signals(signum).name} after step {step}: its state is in "
            f"{checkpoint} (marked LAST_GOOD); rerun with resume=true to continue the run"
        )


class StopSignals:
    """Context manager recording the first of `STOP_SIGNALS` in `received` (None until then)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        self._pid = os.getpid()  # the installer's: a forked worker inherits the handler, not this
        if threading.current_thread() is threading.main_thread():
            for s in STOP_SIGNALS:
                previous = signal.signal(s, self._handle)
                # None: a handler not set from Python; the default stands in for it
                self._previous[s] = signal.SIG_DFL if previous is None else previous
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        if self.received is not None:  # the second one: act as without us
            signal.signal(signum, self._previous[signum])
            signal.raise_signal(signum)
            return
        self.received = signum
        if os.getpid() != self._pid:  # a forked data-loader worker: the trainer speaks for it
            return
        print(
            f"[distill] {signal.Signals(signum).name}: stopping after this step with its state "
            "saved; send it again to stop now",
            file=sys.stderr,
            flush=True,
        )

    def flags(self) -> list[float]:
        """One 0/1 per signal in `STOP_SIGNALS`, to be summed over ranks."""
        return [float(self.received == s) for s in STOP_SIGNALS]


def agreed_signal(counts: list[float]) -> int | None:
    """The signal to stop for, from `flags()` summed over ranks (SIGTERM first); None: go on."""
    return next((int(s) for s, n in zip(STOP_SIGNALS, counts, strict=True) if n > 0), None)
