"""A data set of a test's own, registered from this one module as a user's would be (a config names it in its
custom_imports): "toy", a semantic set of SPLIT/pictures/NAME.jpg and SPLIT/labels/NAME.png (class c stored as c,
255 ignored), read by a data class of its own and checked before a run (every picture has its label), the embedded
pages written in it where its folder is absent; so that the tools that run it (train_seg, test_seg, predict_seg)
can be seen to ask the layout, never to know it."""
from __future__ import annotations

import shutil
from pathlib import Path

import cv2
import numpy as np

import backbones.dense  # noqa: F401  (first: it lets mmseg import on mmcv-lite)

# isort: split
from mmseg.datasets import BaseSegDataset
from mmseg.registry import DATASETS

from backbones.common.errors import DataError
from backbones.common.files import ready_mark, write_folder_once
from backbones.dense.layouts import SmallDenseData, WrittenLayout, register_layout

PICTURES, LABELS = 'pictures', 'labels'  # each split's folders
SPLITS = {'training': 'train', 'validation': 'val'}  # the small data's splits as the toy layout names them
IGNORED = 255


@DATASETS.register_module()
class ToySegDataset(BaseSegDataset):
    """mmseg's reader of a folder of images and one of class maps (.jpg, .png), under a type of the toy layout's; the
    classes are the config's."""


@register_layout
class ToyLayout(WrittenLayout):
    name = 'toy'
    title = 'the toy layout'
    dataset_types = ('ToySegDataset',)
    root = 'data/toy_dense'

    def check(self, dataset_cfg: dict) -> None:
        """Every picture has its label."""
        root, prefix = Path(dataset_cfg.get('data_root') or ''), dataset_cfg['data_prefix']
        bare = [picture for picture in sorted((root / prefix['img_path']).glob('*.jpg'))
                if not (root / prefix['seg_map_path'] / f'{picture.stem}.png').is_file()]
        if bare:
            raise DataError(f'{bare[0]} has no label {root / prefix["seg_map_path"] / bare[0].stem}.png (the toy '
                            f'layout: SPLIT/{PICTURES}/NAME.jpg, SPLIT/{LABELS}/NAME.png)')

    def write_small(self, data: SmallDenseData, root: Path) -> None:
        """The pages and their class maps, class c stored as c (the pages store c + 1, 0 ignored)."""
        write_folder_once(root, f'toy layout v1; {ready_mark(data.root)}', lambda folder: [
            write_split(data, folder, split) for split in SPLITS])

    def use_small(self, dataset_cfg: dict, data: SmallDenseData, split: str) -> None:
        root = self.small_root(data)
        self.write_small(data, root)
        folder = SPLITS[split]
        dataset_cfg.update(data_root=str(root), reduce_zero_label=False,
                           data_prefix=dict(img_path=f'{folder}/{PICTURES}', seg_map_path=f'{folder}/{LABELS}'))


def write_split(data: SmallDenseData, root: Path, split: str) -> None:
    pictures, labels = root / SPLITS[split] / PICTURES, root / SPLITS[split] / LABELS
    pictures.mkdir(parents=True)
    labels.mkdir()
    for page in sorted((data.root / 'images' / split).glob('*.jpg')):
        stored = cv2.imread(str(data.root / 'annotations' / split / f'{page.stem}.png'), cv2.IMREAD_UNCHANGED)
        shutil.copyfile(page, pictures / page.name)
        cv2.imwrite(str(labels / f'{page.stem}.png'), np.where(stored == 0, IGNORED, stored - 1).astype(np.uint8))
