"""Token labeling's label maps: made by a machine annotator (`annotate`), imported from the released ones
(`released_labels`), kept in a store read by path (`label_store`), and the two commands (`commands`). The
augmentation that records each crop's geometry is in `classification.data`, the per-token targets and the loss in
`classification.objectives`, the model side (the token head, MixToken) in `backbones.token_head`."""
