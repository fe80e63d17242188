"""The classification applications: ImageNet-style training with token labeling (`train`) and CIFAR transfer
(`transfer`), with their data, recipes, models and loss."""
