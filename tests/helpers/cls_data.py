"""Tiny ImageNet-layout folders of real image files for the classification tests."""
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

CLASSES = ('n001', 'n002', 'n003')


def class_pattern(label: int, rng: np.random.Generator, size: int) -> np.ndarray:
    """Images a small model can tell apart in a few steps: a bright band whose orientation is the class."""
    img = rng.integers(0, 60, (size, size, 3)).astype(np.uint8)
    band = slice(size // 3, 2 * size // 3)
    if label == 0:
        img[band, :, 0] = 230
    elif label == 1:
        img[:, band, 1] = 230
    else:
        img[band, band, 2] = 230
    return img


def make_image_folder(root: Path, per_class: dict = None, size: int = 40, seed: int = 0,
                      wide: bool = True, classes: Sequence[str] = CLASSES) -> Path:
    """root/{train,val}/CLASS/*.{JPEG,png} with a few images per class; some non-square when `wide`."""
    per_class = per_class or {'train': 8, 'val': 4}
    rng = np.random.default_rng(seed)
    for split, count in per_class.items():
        for label, name in enumerate(classes):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                img = Image.fromarray(class_pattern(label, rng, size))
                if wide and i % 2:
                    img = img.resize((size + size // 2, size))
                suffix = 'JPEG' if i % 3 else 'png'
                img.save(folder / f'{name}_{i}.{suffix}', quality=95)
    return root


def textured_jpegs(folder: Path, sizes: Sequence[tuple[int, int]]) -> list[Path]:
    """JPEGs (quality 90) of colour gradients and waves with noise: texture for decoders and reductions to differ
    on. `sizes`: (width, height) of each."""
    rng = np.random.default_rng(0)
    files = []
    for i, (W, H) in enumerate(sizes):
        y, x = np.mgrid[0:H, 0:W] + 0.5
        rgb = np.stack([255 * x / W, 255 * y / H, 128 + 110 * np.sin(x / 9.0) * np.cos(y / 13.0)], axis=-1)
        files.append(folder / f'{i}.JPEG')
        Image.fromarray(np.uint8(np.clip(rgb + rng.normal(0, 10, (H, W, 3)), 0, 255))).save(files[-1], quality=90)
    return files


def write_tar(path: Path, members: dict[str, bytes]) -> Path:
    """A tar file (tarfile's default format) of `members`, name -> content, in that order."""
    import io
    import tarfile
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, 'w') as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def tar_files(path: Path) -> dict[str, bytes]:
    """A tar's file members, name -> content, in their order."""
    import tarfile
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def split_tars(split_dir: Path, out: Path, layout: str) -> None:
    """The images of an ImageNet-layout split folder as tars at `out` (a tar or a folder): `ilsvrc` one tar of
    per-class tars (the ILSVRC2012 training tar), `per-class` a folder of CLASS.tar, `shards` two webdataset-style
    shards (`CLASS/KEY.EXT` with a `CLASS/KEY.cls` beside each image), `class-folders` one tar of CLASS/FILE."""
    files = {f'{c.name}/{f.name}': f.read_bytes() for c in sorted(split_dir.iterdir()) for f in sorted(c.iterdir())}
    classes = sorted({name.split('/')[0] for name in files})
    per_class = {c: {name.split('/')[1]: data for name, data in files.items() if name.startswith(f'{c}/')}
                 for c in classes}
    if layout == 'ilsvrc':
        inner = {c: write_tar(out.parent / f'.{c}.tar', members).read_bytes() for c, members in per_class.items()}
        write_tar(out, {f'{c}.tar': data for c, data in inner.items()})
        for c in classes:
            (out.parent / f'.{c}.tar').unlink()
    elif layout == 'per-class':
        for c, members in per_class.items():
            write_tar(out / f'{c}.tar', members)
    elif layout == 'shards':
        names = list(files)[::-1]  # shards need not follow the class order
        for shard, part in enumerate((names[::2], names[1::2])):
            members = {}
            for name in part:
                members[name] = files[name]
                members[name.rsplit('.', 1)[0] + '.cls'] = str(classes.index(name.split('/')[0])).encode()
            write_tar(out / f'shard-{shard:06d}.tar', members)
    elif layout == 'class-folders':
        write_tar(out, files)
    else:
        raise ValueError(layout)


def wds_shards(data: Path, out: Path, shards: int = 2, with_json: bool = False, with_cls: bool = True,
               info: bool = True) -> Path:
    """The train and val images of the ImageNet-layout folder `data` as timm's and the Hub's webdataset shards in
    `out` (`imagenet-train-NNNN.tar`, `imagenet-validation-NNNN.tar`): each image `KEY.EXT` (KEY its file's stem)
    with `KEY.cls` (the class index as text) and/or (`with_json`) `KEY.json` (label, class_name, filename), the
    samples dealt over `shards` shards in reverse order; `info`: an `_info.json` naming the splits' shards and
    counts, and the classes."""
    import json
    classes = sorted(p.name for p in (data / 'train').iterdir())
    splits = {}
    for split, name in (('train', 'train'), ('val', 'validation')):
        images = [f for c in classes for f in sorted((data / split / c).iterdir())][::-1]
        filenames, lengths = [], []
        for shard in range(shards):
            members = {}
            for image in images[shard::shards]:
                label = classes.index(image.parent.name)
                members[image.name] = image.read_bytes()
                if with_cls:
                    members[f'{image.stem}.cls'] = str(label).encode()
                if with_json:
                    members[f'{image.stem}.json'] = json.dumps(
                        {'filename': image.name, 'label': label, 'class_name': image.parent.name}).encode()
            filenames.append(write_tar(out / f'imagenet-{name}-{shard:04d}.tar', members).name)
            lengths.append(len(images[shard::shards]))
        splits[name] = {'name': name, 'num_samples': len(images), 'filenames': filenames, 'shard_lengths': lengths}
    if info:
        (out / '_info.json').write_text(json.dumps({'name': 'imagenet', 'splits': splits, 'classes': classes}))
    return out
