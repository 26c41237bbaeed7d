"""`python -m train.prepare_target NAME --out DIR`: kept because earlier docs and recipes use this
name; the command lives in train/prepare/target.py (`python -m train.prepare.target`)."""

import sys

from train.prepare.target import main

if __name__ == "__main__":
    sys.exit(main())
