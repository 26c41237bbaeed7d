"""`python -m train.recipe`: the command lives in train/recipe/run.py."""

import sys

from train.recipe.run import main

sys.exit(main())
