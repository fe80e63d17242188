"""Pictures of models and runs: what the models attend to, training curves, and the figure helpers the task pictures
(`token_labeling/pictures.py`, `segmentation/pictures.py`) and tools/visualize.py share."""
