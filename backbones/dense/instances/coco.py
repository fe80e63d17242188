"""COCO-format instance data: the annotation file read and checked, `CocoInstances`, the data set over it, and COCO's
and an own set's layouts (`CocoLayout`).

Any category ids work: sorted by id, the categories become labels 0 .. N-1, and the data set's metainfo records both
(`classes`, `cat_ids`), which mmengine writes into every checkpoint. Anything that would train or score wrongly is a
one-line DataError naming the file. docs/instances_and_depth.md gives the format."""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
from pathlib import Path

from mmengine.config import Config
from mmengine.dataset import BaseDataset
from mmseg.registry import DATASETS
from PIL import Image
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from backbones.common.errors import CheckpointError, DataError
from backbones.common.log import logger
from backbones.dense.layouts import DataLayout, SmallDenseData, image_folder, register_layout
from backbones.dense.own_data import annotation_file
from backbones.dense.runner import checkpoint_meta

SHOWN = 5
EDGE = 1.0  # pixels a polygon may reach past its image's border (rounding in annotation tools)


def load_coco(path: str | Path, image_folder: str | Path | None = None) -> COCO:
    """An annotation file as pycocotools reads it, checked (`check_coco`); its summary lines go to the log."""
    try:
        content = json.loads(Path(path).read_text())
    except FileNotFoundError as e:
        raise DataError(f'{path}: annotation file not found') from e
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f'{path}: not a readable COCO annotation file ({type(e).__name__}: {e})') from e
    check_coco(content, path, image_folder)
    fill_in_annotations(content)
    coco = COCO()
    coco.dataset = content
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


def fill_in_annotations(content: dict) -> None:
    """COCO evaluation's `iscrowd` (0) and `area` (the mask's pixels), filled in place where a file leaves them out."""
    sizes = {image['id']: (image['height'], image['width']) for image in content['images']}
    for annotation in content.get('annotations', []):
        annotation.setdefault('iscrowd', 0)
        if 'area' not in annotation:
            height, width = sizes[annotation['image_id']]
            annotation['area'] = float(mask_utils.area(mask_rle(annotation['segmentation'], height, width)))


def mask_rle(mask, height: int, width: int) -> dict:
    """A COCO mask (polygons, uncompressed or compressed RLE) as one compressed RLE."""
    if isinstance(mask, list):
        return mask_utils.merge(mask_utils.frPyObjects(mask, height, width))
    if isinstance(mask['counts'], list):
        return mask_utils.frPyObjects(mask, height, width)
    return mask


def check_ids(items: list, what: str, path: str | Path) -> None:
    """Every item has a whole-number `id` used once (pycocotools keys them by id); a repeated one names both entries."""
    ids = [item.get('id') if isinstance(item, dict) else None for item in items]
    odd = next((number for number, i in enumerate(ids) if isinstance(i, bool) or not isinstance(i, int)), None)
    if odd is not None:
        raise DataError(f'{path}: every {what} needs a whole-number "id"; {what}s[{odd}] has '
                        f'{ids[odd]!r} ({str(items[odd])[:60]})')
    first: dict[int, int] = {}
    for number, i in enumerate(ids):
        earlier = first.setdefault(i, number)
        if earlier != number:
            raise DataError(f'{path}: the {what} id {i} is given twice ({what}s[{earlier}] {entry(items[earlier])} '
                            f'and {what}s[{number}] {entry(items[number])}): each needs an id of its own')


def entry(item: dict) -> str:
    """An image or annotation in a few words: its file, or its image and category."""
    if 'file_name' in item:
        return str(item['file_name'])
    return f'of image {item.get("image_id")}, category {item.get("category_id")}'


def number_list(value, count: int) -> bool:
    """`value` is a list of `count` finite numbers."""
    return (isinstance(value, list) and len(value) == count
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value))


def check_coco(content, path: str | Path, image_folder: str | Path | None = None) -> None:
    """The parts of a COCO annotation file the suite relies on, each wrong one a DataError naming `path` (a box or
    mask outside its image blamed on the declared size where the file in `image_folder` has another)."""
    if not isinstance(content, dict) or not all(isinstance(content.get(k), list) for k in ('images', 'categories')) \
            or not isinstance(content.get('annotations', []), list):
        raise DataError(f'{path}: not a COCO annotation file (it needs "images", "categories" and "annotations" '
                        f'lists)')
    categories = content['categories']
    if not categories:
        raise DataError(f'{path}: declares no categories')
    ids = [c.get('id') if isinstance(c, dict) else None for c in categories]
    names = [c.get('name') if isinstance(c, dict) else None for c in categories]
    if any(isinstance(i, bool) or not isinstance(i, int) for i in ids) or not all(isinstance(n, str) for n in names):
        raise DataError(f'{path}: every category needs a whole-number "id" and a "name"')
    for what, values in (('id', ids), ('name', names)):
        repeated = sorted({str(v) for v in values if values.count(v) > 1})
        if repeated:
            raise DataError(f'{path}: category {what}s declared more than once: {", ".join(repeated[:SHOWN])}')
    check_ids(content['images'], 'image', path)
    check_ids(content.get('annotations', []), 'annotation', path)
    images = {}
    for image in content['images']:
        if not isinstance(image, dict) or not isinstance(image.get('file_name'), str) \
                or not all(isinstance(image.get(k), int) and image[k] > 0 for k in ('width', 'height')):
            raise DataError(f'{path}: every image needs an "id", a "file_name", and a positive "width" and "height" '
                            f'({str(image)[:80]})')
        images[image.get('id')] = image
    check_file_names(content['images'], path)
    declared = set(ids)
    for annotation in content.get('annotations', []):
        try:
            check_annotation(annotation, images, declared, path)
        except DataError as error:
            image = images.get(annotation.get('image_id')) if isinstance(annotation, dict) else None
            raise (misdeclared_size(image, image_folder, path) or error) from None


def check_file_names(images: list[dict], path: str | Path) -> None:
    """No image file is listed twice (under a second id, its objects would train as background)."""
    first: dict[str, int] = {}
    for image in images:
        other = first.setdefault(image['file_name'], image['id'])
        if other != image['id']:
            raise DataError(f'{path}: images {other} and {image["id"]} are both the file {image["file_name"]}: list '
                            f'each image once, with all its annotations')


def misdeclared_size(image: dict | None, image_folder: str | Path | None, path: str | Path) -> DataError | None:
    """The error of an image whose file in `image_folder` is not its declared size, or None."""
    if image is None or image_folder is None:
        return None
    file = Path(image_folder) / image['file_name']
    try:
        with Image.open(file) as opened:
            width, height = opened.size
    except Exception:  # no such file, not an image: the data check names it
        return None
    if (width, height) == (image['width'], image['height']):
        return None
    return DataError(f'{path}: image {image["id"]} ({file}) is declared {image["width"]}x{image["height"]}, its file '
                     f'is {width}x{height}: correct its "width" and "height"')


def check_annotation(annotation, images: dict, declared: set, path: str | Path) -> None:
    if not isinstance(annotation, dict):
        raise DataError(f'{path}: an annotation is not an object ({str(annotation)[:80]})')
    where = f'{path}: annotation {annotation.get("id")} (image {annotation.get("image_id")})'
    if annotation.get('category_id') not in declared:
        raise DataError(f'{where} has category_id {annotation.get("category_id")!r}, which the file does not '
                        f'declare (its categories: {", ".join(map(str, sorted(declared)[:10]))})')
    image = images.get(annotation.get('image_id'))
    if image is None:
        raise DataError(f'{where} names an image the file does not list')
    width, height = image['width'], image['height']
    box = annotation.get('bbox')
    if not number_list(box, 4) or box[2] < 0 or box[3] < 0 or box[0] < -EDGE or box[1] < -EDGE \
            or box[0] + box[2] > width + EDGE or box[1] + box[3] > height + EDGE:
        raise DataError(f'{where}: bbox {box} is not x, y, width, height inside its {width}x{height} image')
    if 'area' in annotation and not number_list([annotation['area']], 1) or annotation.get('iscrowd', 0) not in (0, 1):
        raise DataError(f'{where}: "area" must be a number and "iscrowd" 0 or 1 (got {annotation.get("area")!r}, '
                        f'{annotation.get("iscrowd")!r})')
    mask = annotation.get('segmentation')
    if isinstance(mask, dict):
        check_rle(mask, height, width, where)
    elif isinstance(mask, list):
        if not mask:
            raise DataError(f'{where}: its mask has no polygon')
        for polygon in mask:
            if not number_list(polygon, len(polygon) if isinstance(polygon, list) else -1) \
                    or len(polygon) < 6 or len(polygon) % 2:
                raise DataError(f'{where}: a polygon must be a list of at least three x, y pairs')
            xs, ys = polygon[0::2], polygon[1::2]
            if min(xs) < -EDGE or min(ys) < -EDGE or max(xs) > width + EDGE or max(ys) > height + EDGE:
                raise DataError(f'{where}: its mask reaches outside its {width}x{height} image')
    else:
        raise DataError(f'{where}: segmentation must be polygons or an RLE mask')


def check_rle(mask: dict, height: int, width: int, where: str) -> None:
    """An RLE mask of its image's size whose runs decode (pycocotools reads past the end of shorter ones)."""
    if mask.get('size') != [height, width] or 'counts' not in mask:
        raise DataError(f'{where}: its RLE mask is {mask.get("size")} (height, width), its image {[height, width]}')
    counts = mask['counts']
    if isinstance(counts, list):
        if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts) \
                or sum(counts) != height * width:
            raise DataError(f'{where}: its RLE counts must be whole numbers from 0 adding up to its {height}x{width} '
                            f'pixels')
        return
    try:
        if not isinstance(counts, str) or mask_utils.decode(dict(size=mask['size'], counts=counts)).shape != \
                (height, width):
            raise ValueError('not a string of its size')
    except (ValueError, TypeError, OverflowError) as e:
        raise DataError(f'{where}: its compressed RLE mask does not decode ({e})') from e


def categories(coco: COCO) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The categories' names and ids, in label order (sorted by id)."""
    found = sorted(coco.dataset['categories'], key=lambda c: c['id'])
    return tuple(c['name'] for c in found), tuple(c['id'] for c in found)


@DATASETS.register_module()
class CocoInstances(BaseDataset):
    """A COCO-format set: `ann_file` (under `data_root`) and its images in `data_prefix['img_path']`. Each entry holds
    its image's instances: box (x1, y1, x2, y2), label, mask (COCO's polygons or RLE) and `ignore_flag` (crowd)."""

    METAINFO: dict = dict(classes=None)

    def load_data_list(self) -> list[dict]:
        coco = load_coco(self.ann_file, self.data_prefix.get('img_path', ''))
        names, ids = categories(coco)
        self._metainfo.update(classes=names, cat_ids=ids, ann_file=os.path.abspath(self.ann_file))
        label_of = {cat: label for label, cat in enumerate(ids)}
        folder = self.data_prefix.get('img_path', '')
        data_list = []
        for image_id in sorted(coco.imgs):
            image = coco.imgs[image_id]
            instances = [dict(bbox=[x, y, x + w, y + h], bbox_label=label_of[a['category_id']],
                              mask=a['segmentation'], ignore_flag=int(bool(a.get('iscrowd', 0))))
                         for a in coco.imgToAnns.get(image_id, []) for x, y, w, h in [a['bbox']]]
            data_list.append(dict(img_path=os.path.join(folder, image['file_name']), img_id=image_id,
                                  width=image['width'], height=image['height'], instances=instances))
        return data_list


DATASETS.register_module('OwnCocoInstances', module=CocoInstances)  # an own set's type, which finds its layout


@register_layout
class CocoLayout(DataLayout):
    """COCO: annotations/instances_{train2017,val2017}.json and the images in {train2017,val2017}/."""

    title = 'COCO'
    dataset_types = ('CocoInstances',)
    root = 'data/coco'

    def use_small(self, dataset_cfg: dict, data: SmallDenseData, split: str) -> None:
        dataset_cfg.update(type='CocoInstances', data_root=str(data.root),
                           ann_file=f'annotations/instances_{split}.json', data_prefix=dict(img_path=f'images/{split}'))


@register_layout
class OwnCocoLayout(CocoLayout):
    title = 'a COCO-format set of your own'
    dataset_types = ('OwnCocoInstances',)
    root = 'data/own_coco'


def read_split(dataset: dict) -> COCO:
    """A data set config's annotation file, read and checked against its images (`load_coco`)."""
    return load_coco(annotation_file(dataset), image_folder(dataset))


def use_coco_categories(cfg: Config) -> tuple[str, ...]:
    """The model's class count from the training set's categories, which every split must declare; returns the names."""
    loaders = [name for name in ('train_dataloader', 'val_dataloader', 'test_dataloader') if cfg.get(name)]
    files = {name: annotation_file(cfg[name].dataset) for name in loaders}
    read = {name: read_split(cfg[name].dataset) for name in loaders}
    reference_file, reference = files[loaders[0]], read[loaders[0]]
    names, ids = categories(reference)
    for name, coco in read.items():
        other = categories(coco)
        if other != (names, ids):
            raise DataError(f'{files[name]} declares other categories than {reference_file} ({len(other[0])} against '
                            f'{len(names)}): every split needs the same ones, with the same ids')
    cfg.model['num_classes'] = len(names)
    shown = ', '.join(names[:8]) + (', ...' if len(names) > 8 else '')
    logger.info(f'data: {len(names)} categories ({shown}) from {reference_file}')
    warn_untrained(reference, reference_file)
    return names


def warn_untrained(coco: COCO, path: Path) -> None:
    """One line for a training file's categories without annotations, one for its boxes without width or height."""
    annotations = [a for a in coco.dataset.get('annotations', []) if not a['iscrowd']]
    used = {a['category_id'] for a in annotations}
    unused = [f'{c["name"]} (id {c["id"]})' for c in sorted(coco.dataset['categories'], key=lambda c: c['id'])
              if c['id'] not in used]
    if unused:
        logger.warning(f'warning: {path}: {len(unused)} categories have no annotation, which the detector never '
                       f'learns: {", ".join(unused[:SHOWN])}{", ..." if len(unused) > SHOWN else ""}')
    flat = [a for a in annotations if a['bbox'][2] <= 0 or a['bbox'][3] <= 0]
    if flat:
        logger.warning(f'warning: {path}: {len(flat)} annotation(s) with a box of no width or height are left out of '
                       f'training (the first: annotation {flat[0]["id"]} of image {flat[0]["image_id"]}, bbox '
                       f'{flat[0]["bbox"]}, its mask {flat[0]["area"]:g} pixels)')


def use_trained_categories(cfg: Config, checkpoint: str) -> None:
    """A detector's config with no data set at hand takes the number of categories its checkpoint was trained on."""
    trained = (checkpoint_meta(checkpoint).get('dataset_meta') or {}).get('classes')
    if not trained:
        raise CheckpointError(f'{checkpoint} records no categories (mmengine\'s meta.dataset_meta): give --data-root, '
                              'the data set it was trained on')
    cfg.model['num_classes'] = len(trained)


def use_test_categories(cfg: Config, checkpoint: str) -> None:
    """A trained detector's class count from the test set's categories, which must be those it records."""
    trained = checkpoint_meta(checkpoint).get('dataset_meta') or {}
    path = annotation_file(cfg.test_dataloader.dataset)
    names, ids = categories(read_split(cfg.test_dataloader.dataset))
    if trained.get('classes'):
        recorded = list(zip(trained.get('cat_ids', ids), trained['classes']))
        declared = list(zip(ids, names))
        if recorded != declared:
            shown = ', '.join(f'{i} {n}' for i, n in recorded[:SHOWN]) + (', ...' if len(recorded) > SHOWN else '')
            differ = ', '.join([f'{i} {n}' for i, n in declared if (i, n) not in recorded][:SHOWN]) or 'no others'
            raise CheckpointError(f'{checkpoint} was trained on {len(recorded)} categories (id and name: {shown}); '
                                  f'{path} declares {len(declared)}, among them {differ}')
    cfg.model['num_classes'] = len(names)
