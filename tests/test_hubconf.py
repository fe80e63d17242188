"""hubconf.py, as torch.hub reads a checkout (`source='local'`): an entry point for every classifier of the suite,
loading its release file from torch hub's cache as timm would download it. (The released segmentors' entry points:
tests/test_seg_release.py.)"""
from __future__ import annotations

from pathlib import Path

import pytest
import timm
import torch

from backbones.registry import families, suite_models
from backbones.weights import url_cache_path

REPOSITORY = str(Path(__file__).resolve().parents[1])
SEGMENTORS = {'upernet_lvvit_s', 'upernet_lvvit_m', 'upernet_lvvit_l'}


@pytest.fixture
def torch_home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch'))  # not torch.hub.set_dir: it outlives the test
    return tmp_path / 'torch' / 'hub'


def test_the_entry_points_are_the_suite_classifiers_and_the_released_segmentors_and_nothing_else():
    hubconf = torch.hub._import_module('hubconf', str(Path(REPOSITORY) / 'hubconf.py'))
    # torch.hub.list's rule (it lists GitHub repositories only): the module's callables not starting with _
    entries = {name for name in dir(hubconf) if callable(getattr(hubconf, name)) and not name.startswith('_')}
    assert entries == set(suite_models()) | SEGMENTORS
    assert {family.name for family in families()} == {'vit', 't2t_vit', 'cait', 'lvvit'}
    assert {'lvvit_s', 't2t_vit_14', 'cait_s24_224', 'deit_small_patch16_224', 'vit_base_patch16_224'} <= entries


def test_a_classifier_loads_its_release_file_from_torch_hubs_cache(torch_home):
    url = timm.models.get_pretrained_cfg('lvvit_t').url
    released = timm.create_model('lvvit_t', num_classes=1000)
    cache = url_cache_path(url)
    assert str(cache).startswith(str(torch_home))
    cache.parent.mkdir(parents=True)
    torch.save({'model': released.state_dict()}, cache)  # the release's wrapper, as TokenLabeling's files hold
    model = torch.hub.load(REPOSITORY, 'lvvit_t', source='local')
    assert model.state_dict().keys() == released.state_dict().keys()
    for key, value in released.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key


def test_without_weights_nothing_is_read_and_keywords_reach_the_builder(torch_home):
    model = torch.hub.load(REPOSITORY, 't2t_vit_7', source='local', pretrained=False, num_classes=10)
    assert model.num_classes == 10 and not torch_home.exists()


def test_a_tag_picks_its_release_file_and_resolution(torch_home):
    url = timm.models.get_pretrained_cfg('lvvit_s.tl_in1k_384').url
    released = timm.create_model('lvvit_s', img_size=384)
    url_cache_path(url).parent.mkdir(parents=True)
    torch.save(released.state_dict(), url_cache_path(url))
    model = torch.hub.load(REPOSITORY, 'lvvit_s', source='local', tag='tl_in1k_384')
    assert model.pretrained_cfg['input_size'] == (3, 384, 384)
    assert torch.equal(model.pos_embed, released.pos_embed) and model.pos_embed.shape[1] == 24 * 24 + 1
