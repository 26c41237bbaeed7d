"""What leaves a run: the vLLM-format export, calibration of the confidence head, the model card,
and the Hub push (`train.publish.push`)."""
