# DINOv2's "+ms" linear segmentation of LV-ViT-S's frozen features on ADE20K: the last 4 blocks concatenated, a batch
# norm and a 1x1 convolution; the multi-scale test (--ms) at DINOv2's ratios of the single-scale size, with flips.
_base_ = ['./linear_lvvit_s.py']
model = dict(backbone=dict(out_indices=(12, 13, 14, 15)),
             decode_head=dict(in_channels=[384] * 4, in_index=[0, 1, 2, 3], channels=4 * 384))
test_scale = (2048, 512)
img_ratios = [1.0, 1.32, 1.73, 2.28, 3.0]
tta_pipeline = [
    dict(type='LoadImageFromFile', color_type='color_ignore_orientation'),
    dict(type='TestTimeAug', transforms=[
        [dict(type='Resize', scale=(int(test_scale[0] * r), int(test_scale[1] * r)), keep_ratio=True)
         for r in img_ratios],
        [dict(type='LoadAnnotations')],
        [dict(type='PackSegInputs')],
    ]),
]
