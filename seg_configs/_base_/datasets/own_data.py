# A data set of your own (docs/segmentation.md, "Your own data"): images/{train,val}/ and masks/{train,val}/ under
# data_root ("training"/"validation" and "annotations" work too), mask values 0..N-1 the classes, 255 ignored; the
# classes from data_root/classes.txt or counted from the masks. The suite's tools fill in the folders, the image
# suffix, the classes and the heads' class count from the data, and size the schedule to it (`own_data`): ADE20K's
# recipe is 160k x 16 / 20,210 images = 127 epochs, at least 1,000 updates. Pipelines and sizes are ADE20K's.
_base_ = ['./ade20k.py']
dataset_type = 'BaseSegDataset'
data_root = 'data/own_seg'
own_data = dict(epochs=127, min_iters=1000)
train_dataloader = dict(
    batch_size=8,  # per GPU: one GPU takes the batch of 8 images
    dataset=dict(type=dataset_type, data_root=data_root,
                 data_prefix=dict(img_path='images/train', seg_map_path='masks/train')),
)
val_dataloader = dict(
    dataset=dict(type=dataset_type, data_root=data_root,
                 data_prefix=dict(img_path='images/val', seg_map_path='masks/val')),
)
test_dataloader = val_dataloader
