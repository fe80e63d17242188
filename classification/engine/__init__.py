"""The classification training loop ImageNet training and CIFAR transfer share: the epoch loop under mixed precision
and gradient accumulation, evaluation, crash-safe checkpoints that resume exactly, and the run's logs."""
