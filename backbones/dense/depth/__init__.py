"""Monocular depth estimation with the suite's backbones: mmseg's depth estimator (`TokenDepthEstimator`, its
sliding-window test mended), a DPT-style fusion head (`DepthFusionHead`), NYU-v2's layout through mmseg's data set,
KITTI's Eigen split and layout (`kitti`), and `DepthReport`, mmseg's depth metric mended (KITTI's Garg crop too) and
able to write its figures and predictions."""
from backbones.dense.depth import estimator, head, kitti, metric  # noqa: F401  (registration)
