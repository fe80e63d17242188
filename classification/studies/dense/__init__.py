"""The dense models' speed: segmentation's tests and training step (`segmentation_speed`), and each dense config's
training step in its steady state with Mask R-CNN's window attention against global (`training_step`)."""
