# COCO-Stuff-164k (171 classes: 80 things, 91 stuff) in its layout as mmseg reads it, data/coco_stuff164k/:
# images/{train2017,val2017}/*.jpg and annotations/{train2017,val2017}/*_labelTrainIds.png (train ids 0..170, 255
# ignored), written by mmseg's coco_stuff164k.py converter from stuffthingmaps_trainval2017 (COCOStuffIdsDataset,
# mmseg's COCOStuffDataset). mmseg's zoo settings, ADE20K's: (2048, 512) rescaled by 0.5-2.0, 512x512 crops, the
# sliding-window test in 512x512 windows (the model configs' test_cfg); 4 images per GPU on 4 GPUs. Images are read
# as stored, as in ade20k.py.
_base_ = ['./ade20k.py']
dataset_type = 'COCOStuffIdsDataset'
data_root = 'data/coco_stuff164k'
train_dataloader = dict(
    batch_size=4,
    dataset=dict(type=dataset_type, data_root=data_root,
                 data_prefix=dict(img_path='images/train2017', seg_map_path='annotations/train2017')),
)
val_dataloader = dict(
    dataset=dict(type=dataset_type, data_root=data_root,
                 data_prefix=dict(img_path='images/val2017', seg_map_path='annotations/val2017')),
)
test_dataloader = val_dataloader
