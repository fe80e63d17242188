"""Token labeling's label maps: made by a machine annotator (`annotate`), imported from the released ones
(`released_labels`), kept in a store read by path (`label_store`), and the two commands (`commands`)."""
