"""The distillation loop: the trainer, its state and schedule, the loss and what feeds it."""
