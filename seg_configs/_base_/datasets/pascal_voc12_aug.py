# Pascal VOC 2012 with SBD's images ("trainaug": 10,582 training images, mmseg's voc12aug): pascal_voc12.py, its
# training set VOC's train.txt with SegmentationClass's masks and ImageSets/Segmentation/aug.txt (SBD's images in
# neither VOC split) with SegmentationClassAug's, as mmseg's tools/dataset_converters/voc_aug.py writes them from
# SBD's benchmark.tgz; validation on VOC's val (1,449 images).
_base_ = ['./pascal_voc12.py']
train_dataloader = dict(dataset=dict(type='PascalVOCAugIdsDataset', aug_ann_file='ImageSets/Segmentation/aug.txt',
                                     aug_seg_map_path='SegmentationClassAug'))
