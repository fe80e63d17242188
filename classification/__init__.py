"""ImageNet-style classification training with token labeling: data, augmentation, targets, loss, trainer."""
