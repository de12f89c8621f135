"""The optimizer steps the training loop drives: an ES step (ask, evaluate, tell, update) and the backprop
baseline (with DDP/FSDP), both behind the ``Stepper`` protocol; activation checkpointing of the baseline."""
