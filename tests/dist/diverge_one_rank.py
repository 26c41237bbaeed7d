"""`torchrun ... -m tests.dist.diverge_one_rank DISTILL_ARGS`: train.distill with the loss of one
rank's `DSPARK_TEST_NAN_CALL`-th training forward made NaN (rank `DSPARK_TEST_NAN_RANK`), to test
that one rank's divergence cancels the step on every rank."""

import os
import sys

from train.distill import main
from train.loop.objective import DistillObjective

BAD_CALL = int(os.environ["DSPARK_TEST_NAN_CALL"])
BAD_RANK = os.environ.get("DSPARK_TEST_NAN_RANK", "1")
_forward = DistillObjective.forward
_calls = [0]


def _poisoned(self, *args):
    loss, sums = _forward(self, *args)
    if self.training and os.environ.get("RANK") == BAD_RANK:
        _calls[0] += 1
        if _calls[0] == BAD_CALL:
            loss = loss * float("nan")
    return loss, sums


DistillObjective.forward = _poisoned

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
