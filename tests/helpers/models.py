"""Tiny models of every family, and their weights written the way each family's official release files hold them."""
from __future__ import annotations

import argparse
import shutil
import struct
import zipfile
from pathlib import Path

import timm
import torch
import torch.nn as nn

# A tiny DeiT on the command line of the training tools.
TINY_DEIT = ['deit_small_patch16_224', '--model-kwargs', 'embed_dim=32', 'depth=2', 'num_heads=2']

# A tiny configuration of one model per family, and the layout of that family's official release files.
FAMILIES = {
    'lvvit_s': (dict(embed_dim=48, depth=2, num_heads=2), 'timm_train'),
    't2t_vit_14': (dict(embed_dim=64, depth=2, num_heads=2), 'timm_train'),
    'cait_xxs24_224': (dict(embed_dim=48, depth=2, num_heads=2), 'deit'),
    'deit_small_patch16_224': (dict(embed_dim=48, depth=2, num_heads=2), 'deit'),
}


def save_release(path: Path, state_dict: dict[str, torch.Tensor], layout: str) -> Path:
    """Write `state_dict` the way a family's official release file holds it."""
    prefixed = {f'module.{k}': v for k, v in state_dict.items()}
    if layout == 'timm_train':  # LV-ViT, T2T-ViT: timm training checkpoint, DDP prefix, EMA copy, args
        obj = {'epoch': 299, 'arch': 'x', 'state_dict': prefixed, 'state_dict_ema': dict(state_dict),
               'optimizer': {'state': {}, 'param_groups': [{'lr': 1e-3, 'params': [0, 1]}]},
               'version': 2, 'args': argparse.Namespace(model='x', lr=1e-3), 'metric': 83.3}
    elif layout == 'deit':  # DeiT / CaiT: {'model': ...} with the DDP prefix
        obj = {'model': prefixed}
    elif layout == 'plain':  # timm hub / our exports
        obj = dict(state_dict)
    else:
        raise ValueError(layout)
    torch.save(obj, path)
    return path


def tiny_release(name: str, folder: Path, num_classes: int = 1000) -> tuple[nn.Module, Path]:
    """A tiny model of `name`'s family at 64 px (timm's own class), saved in that family's official release layout."""
    kwargs, layout = FAMILIES[name]
    source = timm.create_model(name, img_size=64, num_classes=num_classes, **kwargs)
    return source, save_release(folder / f'{name}.pth', source.state_dict(), layout)


def damaged_copy(checkpoint: Path, copy: Path) -> Path:
    """A copy of a torch checkpoint (zip format) with one byte of its largest tensor flipped, the zip's structure
    intact: what a disk or copy error does, and what torch.load reads without a word (the exponent byte of one
    float32: another value)."""
    shutil.copyfile(checkpoint, copy)
    with zipfile.ZipFile(copy) as archive:
        member = max((m for m in archive.infolist() if '/data/' in m.filename), key=lambda m: m.file_size)
    with open(copy, 'r+b') as f:
        f.seek(member.header_offset + 26)  # the local header's name and extra-field lengths, then the data
        name_length, extra_length = struct.unpack('<HH', f.read(4))
        f.seek(member.header_offset + 30 + name_length + extra_length + 4 * (member.file_size // 8) + 3)
        byte = f.read(1)[0]
        f.seek(-1, 1)
        f.write(bytes([byte ^ 0x7F]))
    return copy


def hooked_block_outputs(model: torch.nn.Module, images: torch.Tensor, blocks: list[int]) -> list[torch.Tensor]:
    """The output tokens of `blocks`, taken by forward hooks on the classifier's own `forward_features` (an
    independent path to the dense backbone's `forward_intermediates`)."""
    outputs = {}
    hooks = [model.blocks[i].register_forward_hook(lambda _, __, out, i=i: outputs.__setitem__(i, out)) for i in blocks]
    with torch.no_grad():
        model.forward_features(images)
    for hook in hooks:
        hook.remove()
    return [outputs[i] for i in blocks]
