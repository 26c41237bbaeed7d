"""Commands that prepare a run's inputs: the target (`train.prepare.target`), prompts and data
(`train.prepare.data`, `train.prepare.self_prompts`, `train.prepare.trim_repeats`), the target's own
answers (`train.prepare.regenerate`) and the loss mask as a run sees it
(`train.prepare.show_mask`)."""
