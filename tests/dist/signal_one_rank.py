"""`torchrun ... -m tests.dist.signal_one_rank DISTILL_ARGS`: train.distill where rank
`DSPARK_TEST_SIGNAL_RANK` sends itself SIGTERM during its `DSPARK_TEST_SIGNAL_CALL`-th training
forward, to test that a signal reaching one rank stops every rank after the same step."""

import os
import signal
import sys

from train.distill import main
from train.loop.objective import DistillObjective

CALL = int(os.environ["DSPARK_TEST_SIGNAL_CALL"])
RANK = os.environ.get("DSPARK_TEST_SIGNAL_RANK", "1")
_forward = DistillObjective.forward
_calls = [0]


def _signalled(self, *args):
    if self.training and os.environ.get("RANK") == RANK:
        _calls[0] += 1
        if _calls[0] == CALL:
            signal.raise_signal(signal.SIGTERM)
    return _forward(self, *args)


DistillObjective.forward = _signalled

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
