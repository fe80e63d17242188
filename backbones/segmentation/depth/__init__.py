"""Monocular depth estimation with the suite's backbones: mmseg's depth estimator (`TokenDepthEstimator`, its
sliding-window test mended), a DPT-style fusion head (`DepthFusionHead`), NYU-v2's layout through mmseg's data set,
and `DepthReport`, mmseg's depth metric mended and able to write its figures and predictions."""
from backbones.segmentation.depth import estimator, head, metric  # noqa: F401  (registration)
