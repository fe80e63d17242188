"""`pretrained=True` as in timm for LV-ViT and T2T-ViT: the official release URLs are in the pretrained cfgs, and
timm's own download and cache path reads the release files through the suite's filter (no network here: a
pre-filled cache and a file:// URL stand in for GitHub)."""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image

import backbones
from helpers.models import save_release

TINY = dict(embed_dim=48, depth=2, num_heads=2)
RELEASE_FILES = {  # REFERENCE section 6
    'lvvit_t': 'https://github.com/zihangJiang/TokenLabeling/releases/download/v0.2.0/lvvit_t.pth',
    'lvvit_s.tl_in1k': 'https://github.com/zihangJiang/TokenLabeling/releases/download/1.0/lvvit_s-26M-224-83.3.pth.tar',
    'lvvit_s.tl_in1k_384':
        'https://github.com/zihangJiang/TokenLabeling/releases/download/1.0/lvvit_s-26M-384-84.4.pth.tar',
    'lvvit_m.tl_in1k_448':
        'https://github.com/zihangJiang/TokenLabeling/releases/download/1.0/lvvit_m-56M-448-85.5.pth.tar',
    'lvvit_l.tl_in1k_512':
        'https://github.com/zihangJiang/TokenLabeling/releases/download/1.0/lvvit_l-150M-512-86.4.pth.tar',
    't2t_vit_14': 'https://github.com/yitu-opensource/T2T-ViT/releases/download/main/81.5_T2T_ViT_14.pth.tar',
    't2t_vit_14.in1k_384': 'https://github.com/yitu-opensource/T2T-ViT/releases/download/main/83.3_T2T_ViT_14.pth.tar',
    't2t_vit_t_19': 'https://github.com/yitu-opensource/T2T-ViT/releases/download/main/82.4_T2T_ViTt_19.pth.tar',
}


@pytest.mark.parametrize('name', list(RELEASE_FILES))
def test_the_pretrained_cfgs_point_at_the_official_release_files(name):
    assert timm.models.get_pretrained_cfg(name).url == RELEASE_FILES[name]


@pytest.mark.parametrize('name, size', [('lvvit_s.tl_in1k_384', 384), ('lvvit_l', 288), ('lvvit_l.tl_in1k_512', 512),
                                        ('t2t_vit_14.in1k_384', 384), ('t2t_vit_14', 224)])
def test_a_tag_gives_the_model_its_weights_resolution(name, size):
    with torch.device('meta'):
        model = timm.create_model(name, depth=1)
    assert model.patch_embed.grid_size == (size // 16, size // 16)
    assert model.pretrained_cfg['input_size'] == (3, size, size)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """torch's hub folder (timm's download cache) in a temporary place."""
    monkeypatch.setattr(torch.hub, '_hub_dir', str(tmp_path / 'hub'))
    (tmp_path / 'hub' / 'checkpoints').mkdir(parents=True)
    return tmp_path / 'hub' / 'checkpoints'


def release_of(name: str, folder: Path, img_size: int = 64, num_classes: int = 1000) -> tuple:
    """A tiny model of `name` saved as its official release (training checkpoint, `module.` prefixes, EMA copy)."""
    source = timm.create_model(name, img_size=img_size, num_classes=num_classes, **TINY).eval()
    return source, save_release(folder / f'{name}.pth.tar', source.state_dict(), 'timm_train')


def test_pretrained_true_reads_the_official_file_from_timms_cache(hub, tmp_path):
    """The file sits in the cache under its release name, as timm leaves it after a download: create_model takes
    it from there, unwrapped, prefixes stripped, the 4x4 position table of the 64 px file resampled to 14x14 at 224,
    with the same outputs as the suite's own loader gives."""
    source, path = release_of('lvvit_s', tmp_path)
    path.rename(hub / 'lvvit_s-26M-224-83.3.pth.tar')
    model = timm.create_model('lvvit_s', pretrained=True, **TINY).eval()
    assert model.patch_embed.grid_size == (14, 14)
    mine, theirs = model.state_dict(), source.state_dict()
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine if k != 'pos_embed')
    # the table: the class slot as it was, the 4x4 patch part bicubically upsampled to 14x14, each channel as Pillow
    # resizes a float image (Keys' cubic, a = -0.5)
    table = theirs['pos_embed'][0]
    channels = [np.asarray(Image.fromarray(table[1:, c].reshape(4, 4).numpy(), 'F').resize((14, 14), Image.BICUBIC))
                for c in range(table.shape[1])]
    upsampled = torch.from_numpy(np.stack(channels, axis=-1)).reshape(196, -1)
    torch.testing.assert_close(mine['pos_embed'][0], torch.cat([table[:1], upsampled]), atol=1e-5, rtol=1e-4)


def test_pretrained_from_a_file_url_with_a_new_class_count(hub, tmp_path):
    """A file:// URL (timm downloads it into its cache); for 10 classes timm drops both classifiers (the cfg names
    `head` and the token head) and everything else is the file's."""
    source, path = release_of('t2t_vit_14', tmp_path, img_size=224)
    model = timm.create_model('t2t_vit_14', pretrained=True, num_classes=10, pretrained_cfg_overlay=dict(
        url=path.as_uri()), **TINY).eval()
    assert (hub / path.name).is_file()  # downloaded into the cache
    mine, theirs = model.state_dict(), source.state_dict()
    assert mine['head.weight'].shape == (10, 48)
    assert all(torch.equal(mine[k], theirs[k]) for k in mine if not k.startswith('head.'))
    lvvit, path = release_of('lvvit_s', tmp_path, img_size=224)
    model = backbones.create_model('lvvit_s', pretrained=True, num_classes=10,
                                   pretrained_cfg_overlay=dict(url=path.as_uri()), **TINY)
    assert model.head.weight.shape == model.aux_head.weight.shape == (10, 48)
    assert torch.equal(model.blocks[1].attn.qkv.weight, lvvit.blocks[1].attn.qkv.weight)


def test_a_release_still_loads_after_timms_own_loader_ran(hub, tmp_path):
    """timm's load_checkpoint allows argparse.Namespace in torch's safe_globals context, which on exit removes it from
    the allowed globals altogether, a global registration included: the suite's loader and timm's download path
    through the suite's families both allow it per load, whatever ran before in the process."""
    source, path = release_of('lvvit_s', tmp_path)
    timm.models.load_checkpoint(timm.create_model('lvvit_s', img_size=64, **TINY), str(path))
    assert argparse.Namespace not in torch.serialization.get_safe_globals()
    model = timm.create_model('lvvit_s', img_size=64, **TINY)
    backbones.load_checkpoint(model, str(path))
    assert all(torch.equal(model.state_dict()[k], v) for k, v in source.state_dict().items())
    path.rename(hub / 'lvvit_s-26M-224-83.3.pth.tar')
    model = timm.create_model('lvvit_s', pretrained=True, img_size=64, **TINY)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in source.state_dict().items())
    assert argparse.Namespace not in torch.serialization.get_safe_globals()  # and nothing left behind


def test_eval_and_predict_take_the_official_release_with_pretrained(hub, tmp_path):
    """--pretrained is the model's release file through timm's cache (here already in it: no network): the same
    predictions as --checkpoint with that file; a model whose timm config names no release is one line naming it."""
    from backbones.common.errors import CheckpointError
    from classification.evaluate import build_parser as eval_parser
    from classification.predict import main as predict_cls
    _, path = release_of('lvvit_s', tmp_path)
    release = path.rename(hub / 'lvvit_s-26M-224-83.3.pth.tar')
    image = tmp_path / 'photo.png'
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (70, 60, 3), dtype=np.uint8)).save(image)
    common = ['lvvit_s', str(image), '--img-size', '64', '--model-kwargs', *(f'{k}={v}' for k, v in TINY.items())]
    assert predict_cls([*common, '--pretrained']) == predict_cls([*common, '--checkpoint', str(release)])
    with pytest.raises(CheckpointError, match="--pretrained='timm': the timm config of lvvit_l names no release"):
        predict_cls(['lvvit_l', str(image), '--pretrained'])
    assert eval_parser().parse_args(['lvvit_s', '--pretrained', '--data-dir', 'imagenet']).pretrained
