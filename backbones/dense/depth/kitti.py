"""KITTI depth as the depth papers use it (`KITTIDepthDataset`): the Eigen split read from BTS's file lists
(`IMAGE DEPTH FOCAL` a line), KITTI raw's images and the improved sparse ground truth (16-bit PNGs of 1/256 m, 0
unmeasured); an entry without ground truth is left out and counted, a line of another form is an error naming it.
`KittiLayout` checks the layout before a run and writes the embedded pages in it. docs/instances_and_depth.md
("KITTI depth") gives the layout."""
from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

import cv2
import numpy as np
from mmseg.datasets import BaseSegDataset
from mmseg.registry import DATASETS

from backbones.common.errors import DataError
from backbones.common.files import ready_mark, write_folder_once
from backbones.common.images import IMG_EXTENSIONS
from backbones.common.log import logger
from backbones.dense.data_check import SHOWN
from backbones.dense.layouts import SmallDenseData, WrittenLayout, register_layout

DEPTH_SCALE = 256  # KITTI's depth PNGs: 1/256 m per unit, 0 = no measurement
IMAGES = 'input'  # KITTI raw's drives: DATE/DATE_drive_NNNN_sync/image_02/data/NNNNNNNNNN.png
GROUND_TRUTH = 'gt_depth'  # DATE_drive_NNNN_sync/proj_depth/groundtruth/image_02/NNNNNNNNNN.png
SPLIT_FILES = {'training': 'eigen_train_files_with_gt.txt', 'validation': 'eigen_test_files_with_gt.txt'}
NO_DEPTH = 'None'
CAMERA = re.compile(r'image_0\d')  # a raw drive's camera folder (image_02 the left colour camera, image_03 the right)
DRIVE = re.compile(r'(\d{4}_\d{2}_\d{2})_drive_\d{4}_sync$')  # a raw drive's folder; its date is its first part


class SplitEntry(NamedTuple):
    """One line of a split file: the image, its depth map (None without one) and the focal length in pixels."""

    image: str
    depth: str | None
    focal: float


def with_date_folder(image: str) -> str:
    """An image's path in the raw tree, DATE/DRIVE/...: a path that starts at the drive gets its date folder."""
    first = image.split('/', 1)[0]
    match = DRIVE.match(first)
    return f'{match.group(1)}/{image}' if match else image


def parse_split_line(line: str, where: str) -> SplitEntry:
    """One line of BTS's split form, `IMAGE DEPTH FOCAL` (DEPTH `None` for a frame without ground truth; the focal
    length in pixels checked, not used); `where` (FILE:LINE) names it in errors."""
    fields = line.split()
    if len(fields) == 3 and fields[1].isdigit() and fields[2] in ('l', 'r'):
        raise DataError(f'{where}: "{line.strip()}" is a Monodepth2-style split line (FOLDER FRAME SIDE); this data '
                        f'set reads BTS\'s form, IMAGE DEPTH FOCAL (eigen_test_files_with_gt.txt of BTS, DPT, '
                        f'Depth-Anything)')
    if len(fields) != 3:
        raise DataError(f'{where}: "{line.strip()}" has {len(fields)} field(s); a split line is IMAGE DEPTH FOCAL '
                        f'(DEPTH None for a frame without ground truth)')
    image, depth, focal = fields
    if Path(image).suffix.lower() not in IMG_EXTENSIONS:
        raise DataError(f'{where}: {image} is not an image file name')
    if depth != NO_DEPTH and Path(depth).suffix.lower() != '.png':
        raise DataError(f'{where}: the depth map {depth} is not a PNG (KITTI\'s are 16-bit PNGs; None for none)')
    try:
        focal_length = float(focal)
    except ValueError:
        raise DataError(f'{where}: the focal length {focal!r} is not a number') from None
    return SplitEntry(with_date_folder(image), None if depth == NO_DEPTH else depth, focal_length)


def frame_of(path: str) -> tuple[str | None, str | None, str]:
    """A raw or ground-truth path's drive folder, camera folder and frame number, where it names them."""
    parts = Path(path).parts
    return (next((part for part in parts if DRIVE.match(part)), None),
            next((part for part in parts if CAMERA.fullmatch(part)), None), Path(path).stem)


def check_same_frame(entry: SplitEntry, where: str) -> None:
    """The depth map of a line is its image's frame (drive, camera, number), else it would score the wrong scene."""
    if entry.depth is None:
        return
    image, depth = frame_of(entry.image), frame_of(entry.depth)
    if any(a is not None and b is not None and a != b for a, b in zip(image, depth)):
        raise DataError(f'{where}: the depth map {entry.depth} is not of the image {entry.image} (its drive, camera or '
                        f'frame differs)')


def read_split_file(path: str | Path) -> list[SplitEntry]:
    """Every entry of a split file, in its order; an image listed twice is an error naming both lines."""
    try:
        lines = Path(path).read_text().splitlines()
    except UnicodeDecodeError as e:
        raise DataError(f'{path} is not a text file ({e}): a split file is lines IMAGE DEPTH FOCAL') from None
    entries, first_line = [], {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        entry = parse_split_line(line, f'{path}:{number}')
        check_same_frame(entry, f'{path}:{number}')
        if entry.image in first_line:
            raise DataError(f'{path}:{number}: the image {entry.image} is listed again (first on line '
                            f'{first_line[entry.image]}): each frame once')
        first_line[entry.image] = number
        entries.append(entry)
    return entries


@DATASETS.register_module()
class KITTIDepthDataset(BaseSegDataset):
    """KITTI depth: the split file's entries with ground truth (the others logged), under data_prefix's paths."""

    # the raw recordings' days (each its own calibration): mmseg's test mode asks for classes, as NYU's name scenes
    METAINFO = dict(classes=('2011_09_26', '2011_09_28', '2011_09_29', '2011_09_30', '2011_10_03'))

    def __init__(self, ann_file: str = SPLIT_FILES['validation'],
                 data_prefix: dict = dict(img_path=IMAGES, depth_map_path=GROUND_TRUTH), **kwargs) -> None:
        self.without_ground_truth: list[str] = []
        # img_suffix None: the split file names the images, none is listed from the folder
        super().__init__(ann_file=ann_file, data_prefix=data_prefix, img_suffix=None, seg_map_suffix='.png',
                         **kwargs)

    def load_data_list(self) -> list[dict]:
        entries = read_split_file(self.ann_file)
        self.without_ground_truth = [entry.image for entry in entries if entry.depth is None]
        if self.without_ground_truth:
            logger.info(f'{self.ann_file}: {len(self.without_ground_truth)} of {len(entries)} entries have no ground '
                        f'truth ({NO_DEPTH}) and are left out, {len(entries) - len(self.without_ground_truth)} used: '
                        + ', '.join(self.without_ground_truth[:SHOWN])
                        + (', ...' if len(self.without_ground_truth) > SHOWN else ''))
        images, depths = Path(self.data_prefix['img_path']), Path(self.data_prefix['depth_map_path'])
        return [dict(img_path=str(images / entry.image), depth_map_path=str(depths / entry.depth),
                     pred_name=prediction_name(entry.image), seg_fields=[])
                for entry in entries if entry.depth is not None]


def prediction_name(image: str) -> str:
    """The name of a frame's predicted depth map: DRIVE_FRAME, with its camera where not the Eigen test's image_02."""
    drive, camera, frame = frame_of(image)
    if drive is None:
        return '_'.join(Path(image).with_suffix('').parts)
    return f'{drive}_{frame}' if camera in (None, 'image_02') else f'{drive}_{camera}_{frame}'


@register_layout
class KittiLayout(WrittenLayout):
    """KITTI depth under data/kitti: input/ (raw drives), gt_depth/ (ground truth) and the Eigen split files."""

    name = 'kitti'
    title = 'KITTI depth (Eigen split)'
    dataset_types = ('KITTIDepthDataset',)
    root = 'data/kitti'

    def check(self, dataset_cfg: dict) -> None:
        """The split file and the images' and ground truth's folders are there; the split file's lines in BTS's form."""
        root = Path(dataset_cfg.get('data_root') or '')
        prefix = {**dict(img_path=IMAGES, depth_map_path=GROUND_TRUTH), **(dataset_cfg.get('data_prefix') or {})}
        split_file = root / dataset_cfg.get('ann_file', SPLIT_FILES['validation'])
        wanted = {split_file: 'the split file (BTS\'s eigen_*_files_with_gt.txt)',
                  root / prefix['img_path']: 'the raw images\' folder (KITTI raw\'s DATE/DATE_drive_NNNN_sync drives)',
                  root / prefix['depth_map_path']: 'the ground truth\'s folder (data_depth_annotated\'s train/ and '
                                                   'val/ drives together)'}
        missing = [f'{what} {path}' for path, what in wanted.items() if not path.exists()]
        if missing:
            raise DataError(f'{self.title} in {root} lacks ' + '; '.join(missing)
                            + ' (docs/instances_and_depth.md, "KITTI depth", says how to lay it out)')
        read_split_file(split_file)

    def write_small(self, data: SmallDenseData, root: Path) -> None:
        """The pages as two drives of a fake day (the Eigen splits), their depths SMALL_SCENE_SCALE times as far."""
        write_folder_once(root, SMALL_VERSION + ready_mark(data.root), lambda folder: write_small_drives(data, folder))

    def use_small(self, dataset_cfg: dict, data: SmallDenseData, split: str) -> None:
        root = self.small_root(data)
        self.write_small(data, root)
        dataset_cfg.update(data_root=str(root), ann_file=SPLIT_FILES[split],
                           data_prefix=dict(img_path=IMAGES, depth_map_path=GROUND_TRUTH))


SMALL_VERSION = 'kitti-eigen small v2: two drives of a fake day, LiDAR-like rows of 1/256 m depth, 10x as far\n'
SMALL_DATE = '2011_09_26'
SMALL_DRIVES = {'training': f'{SMALL_DATE}_drive_0001_sync', 'validation': f'{SMALL_DATE}_drive_0002_sync'}
SMALL_FOCAL = 721.5377  # the split files' focal length for that day's frames
NO_DEPTH_EVERY = 16  # about the Eigen test's share of frames without ground truth (45 of 697)
SCAN_ROW_EVERY = 3  # LiDAR's points lie on scan lines: every third row holds some
SCAN_KEEP = 0.45  # the share of a scan line's pixels kept: about 15% of all
# Small data in the tasks' shared layout hold a room's depths (NYU-v2's format and range); written as KITTI frames
# they stand ten times as far, a road scene's depths within KITTI's 80 m: at a room's scale an 80 m head starts far
# too deep for a small schedule (AbsRel 0.90 after 160 iterations, measured at dcce0c6).
SMALL_SCENE_SCALE = 10


def write_small_drives(data: SmallDenseData, root: Path) -> None:
    """Each split of `data` as a drive of SMALL_DATE under `root`, with its split file."""
    for index, (split, drive) in enumerate(SMALL_DRIVES.items()):
        rng = np.random.default_rng(index)
        lines = [small_entry(data, root, page, f'{drive}/image_02/data/{number:010d}.png',
                             rng if split == 'training' or number % NO_DEPTH_EVERY else None)
                 for number, page in enumerate(sorted((data.root / 'images' / split).glob('*.jpg')))]
        (root / SPLIT_FILES[split]).write_text('\n'.join(lines) + '\n')


def lidar_like(depth: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """`depth` kept where projected LiDAR would measure it (sparse scan lines), 0 elsewhere."""
    rows = np.arange(depth.shape[0])[:, None] % SCAN_ROW_EVERY == rng.integers(SCAN_ROW_EVERY)
    return np.where(rows & (rng.random(depth.shape) < SCAN_KEEP), depth, 0)


def small_entry(data: SmallDenseData, root: Path, page: Path, image: str, rng: np.random.Generator | None) -> str:
    """One page written as a KITTI frame: its image as a PNG under input/SMALL_DATE/`image`, its depth (unless `rng`
    is None: then the entry has none) as a 16-bit PNG of 1/256 m, sparse as LiDAR's; its split line."""
    target = root / IMAGES / SMALL_DATE / image
    target.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(target), cv2.imread(str(page), cv2.IMREAD_COLOR))
    if rng is None:
        return f'{SMALL_DATE}/{image} {NO_DEPTH} {SMALL_FOCAL}'
    drive, _, _, frame = image.split('/')
    depth = f'{drive}/proj_depth/groundtruth/image_02/{frame}'
    units = cv2.imread(str(data.root / 'depth' / page.parent.name / f'{page.stem}.png'), cv2.IMREAD_UNCHANGED)
    kitti = np.round(lidar_like(units.astype(np.float64), rng) * SMALL_SCENE_SCALE * DEPTH_SCALE / data.depth_scale)
    (root / GROUND_TRUTH / depth).parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(root / GROUND_TRUTH / depth), np.clip(kitti, 0, 65535).astype(np.uint16))
    return f'{SMALL_DATE}/{image} {depth} {SMALL_FOCAL}'
