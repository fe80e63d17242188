"""Token labeling's data side: the machine annotator's dense score maps and their store, the label-aware
augmentation that records each crop's geometry, the per-token targets cut along it, and the loss. (The model side,
the token head and MixToken, is `backbones.token_head`.)"""
