"""Pictures of models and runs: what the models attend to, training curves, and the figure helpers the task pictures
(`classification/pictures/token_labels.py`, `backbones/dense/pictures.py`) and tools/visualize.py share."""
