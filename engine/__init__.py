"""The training engine ImageNet training, CIFAR transfer and segmentation share: commands and their errors, the
suite's logger, atomic files, torchrun processes, image files, and the epoch loop with its crash-safe checkpoints."""
