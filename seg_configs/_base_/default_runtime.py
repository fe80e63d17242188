# Runtime shared by every config: mmseg scope, the suite's modules, logging (each data set's config sets its task's
# test-time augmentation, tta_pipeline and tta_model).
default_scope = 'mmseg'
custom_imports = dict(imports=['backbones.dense'], allow_failed_imports=False)
env_cfg = dict(
    cudnn_benchmark=True,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    dist_cfg=dict(backend='nccl'),
)
vis_backends = [dict(type='LocalVisBackend'), dict(type='TensorboardVisBackend')]
visualizer = dict(type='SegLocalVisualizer', vis_backends=vis_backends, name='visualizer')
log_processor = dict(by_epoch=False)
log_level = 'INFO'
load_from = None
resume = False
