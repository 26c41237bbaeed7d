"""The recipe command (`python -m train.recipe NAME`): a target to a served draft in one
command. `run` is the command, `config` the typed recipe, `stages` what each stage runs and writes,
`state` when a stage counts as done, `prompts` the disjoint train/dev/test prompts."""
