"""Training runs slowed down from outside the product, for tests that must catch a run mid-way
(signal it, kill it, run out its time budget): each `Trainer.train_step` is followed by a pause.

In-process: `slow_steps(monkeypatch, seconds)`. In a child process:
`python -m tests.slow_steps SECONDS [python -m train.distill arguments]`.
"""

from __future__ import annotations

import sys
import time

from train.loop.trainer import Trainer


def _slowed(real, seconds: float):
    def train_step(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        time.sleep(seconds)
        return out

    return train_step


def slow_steps(monkeypatch, seconds: float) -> None:
    monkeypatch.setattr(Trainer, "train_step", _slowed(Trainer.train_step, seconds))


def main(argv: list[str]) -> int:
    from train.distill import main as distill

    Trainer.train_step = _slowed(Trainer.train_step, float(argv[0]))
    return distill(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
