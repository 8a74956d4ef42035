"""One run, start to finish: the workbench, the training loop, the joint reference, the continual sessions,
evaluation, checkpoints and the budget guards."""
