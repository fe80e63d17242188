"""Segmentation models: the mmseg backbones, neck, configs, checkpoint loading and layer-wise lr decay."""
from __future__ import annotations

import importlib
import math
import re

import numpy as np
import pytest
import torch
from mmengine.config import ConfigDict
from mmengine.optim import build_optim_wrapper
from mmengine.registry import init_default_scope
from mmengine.structures import PixelData

import backbones.dense  # noqa: F401  (first: it lets mmseg import on mmcv-lite; registers the suite's modules)

# isort: split
from mmseg.models.segmentors import EncoderDecoder
from mmseg.registry import MODELS
from mmseg.structures import SegDataSample

from backbones import CheckpointError, create_model
from backbones.common.errors import UsageError
from backbones.dense.backbone import crop_to_extent
from backbones.dense.complexity import build_meta_model, segmentor_parameters
from backbones.dense.config import FORMER_PACKAGES, load_config, present_module
from backbones.dense.semantic.segmentor import slide_windows
from backbones.dense.trained_checkpoints import check_pretrained
from backbones.weights import fetch_pretrained
from helpers.commands import ROOT
from helpers.models import save_release
from helpers.seg_data import CONFIGS, TINY_MODELS, tiny_config

init_default_scope('mmseg')


def build(cfg):
    model = MODELS.build(cfg.model)
    model.init_weights()
    return model


def sample(height: int, width: int, num_classes: int = 150) -> SegDataSample:
    data_sample = SegDataSample(metainfo=dict(img_shape=(height, width), ori_shape=(height, width)))
    data_sample.gt_sem_seg = PixelData(data=torch.randint(0, num_classes, (1, height, width)))
    return data_sample


@pytest.mark.parametrize('config', sorted(p.name for p in CONFIGS.glob('*.py')))
def test_every_config_builds_with_its_backbone(config):
    cfg = load_config(str(CONFIGS / config))
    counts = segmentor_parameters(build_meta_model(cfg))
    # The backbone holds exactly the classification model's parameters up to the last block used, without the
    # final norm (unless it keeps it: final_norm) and heads (CaiT: also without the class token and class-attention
    # stage).
    with torch.device('meta'):
        reference = create_model(cfg.model.backbone.model_name, img_size=cfg.model.backbone.img_size, num_classes=0)
    last = max(cfg.model.backbone.out_indices)
    norm = '-' if cfg.model.backbone.get('final_norm') else 'norm.'
    kept = sum(p.numel() for name, p in reference.named_parameters()
               if not name.startswith((norm, 'blocks_token_only.', 'cls_token' if 'cait' in config else '-'))
               and not (name.startswith('blocks.') and int(name.split('.')[1]) > last))
    kept += relative_position_tables(cfg.model.backbone, reference, last)
    assert counts['backbone'] == kept
    assert counts['total'] == sum(v for k, v in counts.items() if k != 'total')


def relative_position_tables(backbone: dict, reference: torch.nn.Module, last: int) -> int:
    """The parameters of a windowed backbone's relative-position tables (`rel_pos`): two (2 x side - 1, head_dim) per
    block, the side a window's or, in a global block, the grid's at img_size."""
    if not backbone.get('rel_pos'):
        return 0
    head_dim = reference.embed_dim // reference.blocks[0].attn.num_heads
    grid = max(reference.patch_embed.grid_size)  # the model's own at img_size
    sides = [grid if i in backbone.global_blocks else backbone.window_size for i in range(last + 1)]
    return sum(2 * (2 * side - 1) * head_dim for side in sides)


@pytest.mark.parametrize('config', sorted(TINY_MODELS))
@pytest.mark.slow
def test_one_training_step_reaches_every_parameter(config):
    cfg = tiny_config(config)
    cfg.model.backbone.drop_path_rate = 0.0  # a dropped residual branch would rightly get no gradient
    model = build(cfg).train()
    optim = build_optim_wrapper(model, dict(optimizer=dict(type='AdamW', lr=1e-3)))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    data = dict(inputs=[torch.randint(0, 255, (3, 70, 90), dtype=torch.uint8) for _ in range(2)],
                data_samples=[sample(70, 90) for _ in range(2)])
    losses = model.train_step(data, optim)
    assert all(torch.isfinite(v) for v in losses.values())
    # Every parameter took part (no unused parameter: DDP without find_unused_parameters works) and moved.
    unchanged = [n for n, p in model.named_parameters() if p.requires_grad and torch.equal(p, before[n])]
    assert unchanged == []


@pytest.mark.parametrize('config', sorted(TINY_MODELS))
def test_prediction_at_full_resolution_for_odd_sizes(config):
    cfg = tiny_config(config)
    model = build(cfg).eval()
    data = model.data_preprocessor(dict(inputs=[torch.randint(0, 255, (3, 333, 517), dtype=torch.uint8)],
                                        data_samples=[sample(333, 517)]), training=False)
    with torch.no_grad():
        features = model.backbone(data['inputs'])
        result = model.predict(**data)[0]
    assert all(f.shape[-2:] == (math.ceil(333 / 16), math.ceil(517 / 16)) for f in features)
    assert result.pred_sem_seg.data.shape == (1, 333, 517)
    assert result.seg_logits.data.shape == (150, 333, 517)


def test_crop_to_extent_resamples_the_valid_region():
    # A map whose value is its column index: after keeping the first 13/16 of the width, output column j (centre
    # at (j + 0.5) * 13/16 input cells) must hold (j + 0.5) * 13/16 - 0.5, the bilinear value there.
    h, w = 3, 16
    maps = torch.arange(w, dtype=torch.float32).expand(1, 2, h, w).clone()
    out = crop_to_extent(maps, (1.0, 13 / 16))
    expected = (torch.arange(w) + 0.5) * 13 / 16 - 0.5
    torch.testing.assert_close(out[0, 1, 1], expected.clamp(min=0), atol=1e-5, rtol=0)
    assert torch.equal(crop_to_extent(maps, (1.0, 1.0)), maps)


def test_backbone_features_are_the_models_intermediates():
    cfg = tiny_config('upernet_lvvit_s.py')
    backbone = build(cfg).backbone.eval()
    reference = create_model('lvvit_s', img_size=64, num_classes=0, **TINY_MODELS['upernet_lvvit_s.py']).eval()
    reference.load_state_dict(backbone.model.state_dict(), strict=False)
    x = torch.randn(1, 3, 96, 80)
    with torch.no_grad():
        expected = reference.forward_intermediates(x, [0, 1, 2, 3], intermediates_only=True)
        for got, want in zip(backbone(x), expected):
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize('config', sorted(TINY_MODELS))
def test_drop_path_is_stochastic_depth(config):
    cfg = tiny_config(config)
    cfg.model.backbone.drop_path_rate = 0.3
    blocks = build(cfg).backbone.model.blocks
    rates = [getattr(getattr(b, 'drop_path', None) or b.drop_path1, 'drop_prob', 0.0) for b in blocks]
    # CaiT's rule is one rate for every block; the others ramp it up linearly from 0.
    expected = [0.3] * len(blocks) if 'cait' in config else np.linspace(0, 0.3, len(blocks))
    np.testing.assert_allclose(rates, expected, atol=1e-6)
    dropouts = [m.p for b in blocks for m in b.mlp.modules() if isinstance(m, torch.nn.Dropout)]
    assert all(p == 0 for p in dropouts)


def release_of(name: str, tmp_path, layout: str, **kwargs):
    """An ImageNet classifier of `name` (224 pixels, 1000 classes), saved in a release layout."""
    model = create_model(name, num_classes=1000, **kwargs)
    return model, save_release(tmp_path / f'{name}_{layout}.pth', model.state_dict(), layout)


@pytest.mark.parametrize('config,name,layout', [
    ('upernet_lvvit_s.py', 'lvvit_s', 'timm_train'), ('upernet_t2t_vit_14.py', 't2t_vit_14', 'timm_train'),
    ('upernet_cait_s24.py', 'cait_s24_224', 'deit'), ('upernet_deit_s.py', 'deit_small_patch16_224', 'deit'),
    ('upernet_lvvit_s.py', 'lvvit_s', 'ours'),
])
def test_classification_checkpoint_loads_into_backbone(config, name, layout, tmp_path):
    kwargs = TINY_MODELS[config]
    classifier, path = release_of(name, tmp_path, 'plain' if layout == 'ours' else layout, **kwargs)
    if layout == 'ours':  # what tools/train_cls.py writes as best.pth
        torch.save({'state_dict': classifier.state_dict(), 'state_dict_ema': classifier.state_dict(), 'epoch': 3,
                    'metrics': {'top1': 50.0}, 'args': {'model': name}}, path)
    cfg = tiny_config(config)
    cfg.model.backbone.pretrained = str(path)
    backbone = build(cfg).backbone
    own = backbone.model.state_dict()
    source = classifier.state_dict()
    for key in own:
        if key == 'pos_embed':  # resized from 14x14 to the backbone's 4x4 grid
            assert own[key].shape[1] == source[key].shape[1] - 196 + 16
        elif not key.endswith('num_batches_tracked'):
            assert torch.equal(own[key], source[key]), key


def test_wrong_family_and_missing_keys_are_errors(tmp_path):
    _, t2t = release_of('t2t_vit_14', tmp_path, 'timm_train', **TINY_MODELS['upernet_t2t_vit_14.py'])
    cfg = tiny_config('upernet_lvvit_s.py')
    cfg.model.backbone.pretrained = str(t2t)
    with pytest.raises(CheckpointError, match='holds a t2t_vit model, not lvvit_s'):
        build(cfg)
    classifier = create_model('lvvit_s', **TINY_MODELS['upernet_lvvit_s.py'])
    state = {k: v for k, v in classifier.state_dict().items() if not k.startswith('blocks.2.')}
    torch.save(state, tmp_path / 'partial.pth')
    cfg.model.backbone.pretrained = str(tmp_path / 'partial.pth')
    with pytest.raises(CheckpointError, match='missing keys: blocks.2.norm1.weight'):
        build(cfg)
    cfg.model.backbone.model_name = 'resnet50'
    with pytest.raises(ValueError, match='TokenBackbone takes a model of the suite, not .resnet50.*lvvit_s'):
        build(cfg)


def test_backbone_weights_by_url_or_timms_release_name_come_through_timms_cache(tmp_path, monkeypatch):
    """`pretrained` as a URL is downloaded once into timm's cache (torch hub's checkpoints folder) and loads as the
    file does; `timm` is the release URL of the model's timm config (here found in the cache: no network); a URL
    that cannot be read and a model without a release are one-line errors; the tools' check lets both through."""
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch'))
    cache = tmp_path / 'torch' / 'hub' / 'checkpoints'
    classifier, path = release_of('lvvit_s', tmp_path, 'timm_train', **TINY_MODELS['upernet_lvvit_s.py'])
    cfg = tiny_config('upernet_lvvit_s.py')
    cfg.model.backbone.pretrained = str(path)
    from_file = build(cfg).backbone.model.state_dict()
    cfg.model.backbone.pretrained = path.as_uri()
    check_pretrained(cfg)
    from_url = build(cfg).backbone.model.state_dict()
    assert all(torch.equal(from_url[k], from_file[k]) for k in from_file)
    assert (cache / path.name).is_file()
    release = cache / 'lvvit_s-26M-224-83.3.pth.tar'  # the file name of the URL lvvit_s's timm config names
    path.rename(release)
    cfg.model.backbone.pretrained = 'timm'
    check_pretrained(cfg)
    from_release = build(cfg).backbone.model.state_dict()
    assert all(torch.equal(from_release[k], from_file[k]) for k in from_file)
    cfg.model.backbone.pretrained = (tmp_path / 'absent.pth').as_uri()
    with pytest.raises(CheckpointError, match='cannot download the weights file://.*absent.pth .*by hand and set '
                                              'model.backbone.pretrained'):
        build(cfg)
    with pytest.raises(CheckpointError,
                       match="model.backbone.pretrained='timm': the timm config of lvvit_l names no release"):
        fetch_pretrained('timm', 'lvvit_l')
    cfg.model.backbone.pretrained = str(tmp_path / 'absent.pth')
    with pytest.raises(CheckpointError, match='absent.pth not found: .*to a URL, to timm'):
        check_pretrained(cfg)


def test_layer_decay_scales_lr_per_block():
    cfg = tiny_config('upernet_lvvit_s.py')
    model = build(cfg)
    optim = build_optim_wrapper(model, dict(
        optimizer=dict(type='AdamW', lr=1.0, weight_decay=0.05), constructor='LayerDecayOptimWrapperConstructor',
        paramwise_cfg=dict(layer_decay_rate=0.5)))
    group_of = {id(p): g for g in optim.optimizer.param_groups for p in g['params']}
    num_layers = 4 + 1  # 4 blocks, plus the embedding
    params = dict(model.named_parameters())
    for name, lr, wd in [
        ('backbone.model.patch_embed.conv1.weight', 0.5 ** num_layers, 0.05),
        ('backbone.model.pos_embed', 0.5 ** num_layers, 0.0),
        ('backbone.model.blocks.0.attn.qkv.weight', 0.5 ** 4, 0.05),
        ('backbone.model.blocks.3.mlp.fc1.weight', 0.5, 0.05),
        ('backbone.model.blocks.3.mlp.fc1.bias', 0.5, 0.0),
        ('decode_head.conv_seg.weight', 1.0, 0.05),
        ('neck.levels.0.0.weight', 1.0, 0.05),
    ]:
        group = group_of[id(params[name])]
        assert group['lr'] == pytest.approx(lr), name
        assert group['weight_decay'] == wd, name
    assert sum(len(g['params']) for g in optim.optimizer.param_groups) == len(params)


TABLE_8 = {'fcn_lvvit_s.py': 30, 'upernet_lvvit_s.py': 44, 'upernet_lvvit_m.py': 77, 'upernet_lvvit_l.py': 209}


def test_lvvit_config_sizes_match_the_paper(capsys):
    from backbones.dense.complexity import main
    assert main(['--seg-config', *(str(CONFIGS / name) for name in TABLE_8)]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    for name, row in zip(TABLE_8, rows):
        assert row.split()[0].endswith(name)
        total = float(row.split()[-3])  # then the GMACs and the input size
        assert abs(total - TABLE_8[name]) / TABLE_8[name] < 0.05, (name, total)


@pytest.mark.parametrize('window_batch', [1, 3, 64])
def test_batched_sliding_window_test_equals_mmsegs_window_by_window(window_batch):
    cfg = tiny_config('upernet_lvvit_s.py')
    cfg.model.test_cfg = dict(mode='slide', crop_size=(32, 48), stride=(21, 29), window_batch=window_batch)
    model = build(cfg).eval()
    assert type(model).__name__ == 'SlideBatchEncoderDecoder'
    # Two images, a grid of 3 x 4 windows whose last row and column are moved back to the border.
    inputs = torch.randn(2, 3, 70, 120)
    metas = [dict(img_shape=(70, 120), ori_shape=(70, 120), pad_shape=(70, 120)) for _ in range(2)]
    with torch.no_grad():
        batched = model.slide_inference(inputs, [dict(m) for m in metas])
        one_by_one = EncoderDecoder.slide_inference(model, inputs, [dict(m) for m in metas])
        whole_small = model.slide_inference(inputs[:, :, :20, :30], [dict(m) for m in metas])  # smaller than a window
        small_reference = EncoderDecoder.slide_inference(model, inputs[:, :, :20, :30], [dict(m) for m in metas])
    assert batched.shape == (2, 150, 70, 120)
    torch.testing.assert_close(batched, one_by_one, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(whole_small, small_reference, rtol=1e-4, atol=1e-5)
    model.test_cfg.window_batch = 0
    with pytest.raises(UsageError, match='window_batch must be at least 1, got 0'):
        model.slide_inference(inputs, [dict(m) for m in metas])


def test_slide_windows_cover_the_image_like_mmseg():
    # 70 px with 32 px windows every 21: starts 0, 21, then 42 moved back to 38 so the window ends at the border.
    assert slide_windows((70, 20), (32, 48), (21, 29)) == [(0, 32, 0, 20), (21, 53, 0, 20), (38, 70, 0, 20)]


@pytest.mark.parametrize('iters, phases', [
    (1600, [('LinearLR', 0, 15), ('PolyLR', 15, 1600)]),  # 1,500 warm-up of 160k -> 15 of 1,600
    (1, [('LinearLR', 0, 1)]),  # no iteration left for the decay: mmengine would refuse begin == end
])
def test_shortened_schedule_scales_its_phases(iters, phases):
    from backbones.dense.schedule import shorten_schedule
    cfg = load_config(CONFIGS / 'upernet_lvvit_m.py')
    shorten_schedule(cfg, iters)
    assert [(s['type'], s['begin'], s['end']) for s in cfg.param_scheduler] == phases
    assert cfg.train_cfg['max_iters'] == cfg.train_cfg['val_interval'] == iters


def test_a_step_schedule_drops_its_lr_at_the_same_fractions_when_shortened_or_accumulated():
    """ViTDet's lr drops (iterations 163,889 and 177,546 of 184,375) move with the schedule: a run sized to a set of
    one's own, or of accumulated gradients, still drops its lr twice near its end."""
    from backbones.dense.schedule import accumulate_gradients, shorten_schedule
    cfg = load_config(CONFIGS / 'maskrcnn_lvvit_s.py')
    shorten_schedule(cfg, 1000)
    assert cfg.param_scheduler[-1]['milestones'] == [889, 963]
    accumulate_gradients(cfg, 4)
    assert cfg.param_scheduler[-1]['milestones'] == [3556, 3852] and cfg.train_cfg['max_iters'] == 4000


@pytest.mark.parametrize('test_cfg', [dict(mode='whole'), dict(mode='slide', crop_size=(32, 32), stride=(21, 21))])
@pytest.mark.slow
def test_flip_batched_multi_scale_test_equals_mmsegs_flip_pipeline(tmp_path, test_cfg):
    """Each scale and its mirror image decoded as one batch give mmseg's views: its pipeline flipping every scale
    (each resized twice) and SegTTAModel running the ten views one by one."""
    from mmengine.dataset import pseudo_collate
    from mmseg.models.segmentors import SegTTAModel

    from backbones.dense.semantic.segmentor import FlipBatchTTAModel
    from backbones.dense.tta import flipping_tta_pipeline
    from helpers.seg_data import write_tiny_ade, write_tiny_config
    data = write_tiny_ade(tmp_path / 'ade', counts=(('validation', 2),))
    cfg = load_config(write_tiny_config(tmp_path / 'tiny.py', 'upernet_lvvit_s.py', data))
    init_default_scope('mmseg')
    torch.manual_seed(0)
    module = MODELS.build(cfg.model).eval()
    module.test_cfg = ConfigDict(test_cfg, window_batch=4)
    mmseg_pipeline = flipping_tta_pipeline(cfg.tta_pipeline)

    def batch(pipeline) -> dict:
        from mmseg.registry import DATASETS
        dataset = DATASETS.build({**cfg.test_dataloader.dataset, 'pipeline': pipeline})
        return pseudo_collate([dataset[1]])

    ours, theirs = batch(cfg.tta_pipeline), batch(mmseg_pipeline)
    assert len(ours['inputs']) == 5 and len(theirs['inputs']) == 10
    batched, reference = FlipBatchTTAModel(module=module), SegTTAModel(module=module)
    with torch.no_grad():
        our_views = batched.view_predictions(ours)
        their_views = [reference.module.test_step({k: v[i] for k, v in theirs.items()}) for i in range(10)]
        assert len(our_views) == 10
        for our, their in zip(our_views, their_views):
            torch.testing.assert_close(our[0].seg_logits.data, their[0].seg_logits.data, atol=1e-5, rtol=1e-4)
        merged, expected = batched.test_step(ours)[0], reference.test_step(theirs)[0]
    assert torch.equal(merged.pred_sem_seg.data, expected.pred_sem_seg.data)
    assert torch.equal(merged.gt_sem_seg.data, expected.gt_sem_seg.data)
    with pytest.raises(UsageError, match='already flips its views'):  # mmseg's flipping pipeline: refused
        batched.test_step(theirs)


@pytest.mark.parametrize('iters, accumulate, phases', [
    (40, 1, [('PolyLR', 1, 40)]),  # 1,500 of 160k -> 1 iteration: no warm-up, the lr is the config's from the start
    (40, 2, [('LinearLR', 0, 2), ('PolyLR', 2, 80)]),  # one update of two iterations warms up
    (1, 1, [('LinearLR', 0, 1)]),  # a 1-iteration run keeps its one phase
])
def test_a_warmup_of_one_iteration_is_dropped(iters, accumulate, phases):
    """mmengine's LinearLR over one iteration stays at its start factor, and the decay after it chains on that: the
    whole run would train at 1e-6 of the lr."""
    from backbones.dense.schedule import accumulate_gradients, drop_one_step_warmup, shorten_schedule
    cfg = load_config(CONFIGS / 'upernet_lvvit_m.py')
    shorten_schedule(cfg, iters)
    accumulate_gradients(cfg, accumulate)
    drop_one_step_warmup(cfg)
    assert [(s['type'], s['begin'], s['end']) for s in cfg.param_scheduler] == phases


def endless_sampler(kind: type, size: int, rank: int, world_size: int, seed: int = 5):
    """An InfiniteSampler-like `kind` over `size` items, as process `rank` of `world_size` sees it."""
    sampler = kind(list(range(size)), shuffle=True, seed=seed)
    sampler.rank, sampler.world_size = rank, world_size
    sampler.indices = sampler._indices_of_rank()  # mmengine's stream, split again for the process set here
    return sampler


def test_a_placed_sampler_starts_late_in_a_long_schedule_on_the_indices_mmengine_would_read_there():
    """Placed at iteration 150,000 of 16 images a process (the last of 3 processes, 997 images: passes end
    mid-batch), the sampler yields what mmengine's InfiniteSampler yields there, with the pass each index belongs
    to; unplaced, it yields nothing (a loader started before the resume reads no batch)."""
    import itertools

    from mmengine.dataset import InfiniteSampler

    from backbones.dense.restart import PlacedInfiniteSampler
    size, rank, world, taken = 997, 2, 3, 150_000 * 16
    placed = endless_sampler(PlacedInfiniteSampler, size, rank, world)
    assert list(placed) == []
    placed.start_at(taken)
    draws = list(itertools.islice(iter(placed), 2000))
    expected = list(itertools.islice(iter(endless_sampler(InfiniteSampler, size, rank, world)), taken, taken + 2000))
    assert [d.index for d in draws] == expected
    positions = [rank + world * (taken + k) for k in range(2000)]
    assert [d.epoch for d in draws] == [p // size for p in positions]
    assert len({d.epoch for d in draws}) > 1  # the window crosses a pass


class DrawingDataset:
    """Samples made of draws from Python's, NumPy's and torch's global streams, as the configs' transforms draw."""

    metainfo = {'classes': ('a', 'b')}

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> tuple:
        import random
        return index, random.random(), float(np.random.rand()), float(torch.rand(()))


def test_seeded_samples_are_the_same_whenever_read_and_leave_the_readers_streams_alone():
    """A sample read by its Draw is the same whatever the streams held before (another worker, another point of the
    run), differs between passes and indices, and leaves the reading process's streams where they were."""
    import pickle
    import random

    from backbones.common.random_state import rng_state, seed_all
    from backbones.dense.restart import Draw, SeededSamples
    samples = SeededSamples(DrawingDataset(), seed=3)
    seed_all(0)
    first = samples[Draw(1, 4)]
    seed_all(1)
    before = rng_state()
    assert samples[Draw(1, 4)] == first
    after = rng_state()
    assert random.getstate() == before['python'] and torch.equal(after['torch'], before['torch'])
    assert np.array_equal(after['numpy']['keys'], before['numpy']['keys'])
    assert samples[Draw(2, 4)] != first and samples[Draw(1, 5)][1:] != first[1:]
    copied = pickle.loads(pickle.dumps(samples))  # as a loader process gets it
    assert copied[Draw(1, 4)] == first and copied.metainfo == DrawingDataset.metainfo and len(copied) == 10
    assert SeededSamples(DrawingDataset(), seed=4)[Draw(1, 4)] != first


def test_a_run_without_a_seed_leaves_drawing_it_to_mmengine(tmp_path):
    """A seed drawn by the suite would be drawn in each process of a torchrun job, and each process's sampler would
    shuffle its own way (their shares of the data overlapping); mmengine draws one and gives every process the main
    one's. A configured seed, or a resumed run's own, is kept."""
    from backbones.dense.preemption import run_seed
    assert run_seed(None, tmp_path, resume=False) is None
    assert run_seed(7, tmp_path, resume=True) == 7


def test_a_configs_text_is_mmengines_formatted_once_per_content(monkeypatch):
    """load_config's text (the log's, the dumped file's, each checkpoint's meta) is mmengine's own, yapf-formatted
    text; it is formatted again only when the config has changed."""
    import mmengine.config.config as mmengine_config
    calls = []
    format_code = mmengine_config.FormatCode
    monkeypatch.setattr(mmengine_config, 'FormatCode', lambda *a, **k: calls.append(1) or format_code(*a, **k))
    path = CONFIGS / 'upernet_lvvit_s.py'
    cfg = load_config(str(path))
    reference = mmengine_config.Config.fromfile(str(path))
    texts = [cfg.pretty_text for _ in range(3)]
    assert texts == [reference.pretty_text] * 3 and len(calls) == 2  # one for cfg, one for mmengine's own
    assert "crop_size = (\n    512,\n    512,\n)" in texts[0]  # yapf's layout, not the unformatted one
    cfg.train_cfg.max_iters = reference.train_cfg.max_iters = 7
    assert cfg.pretty_text == reference.pretty_text and 'max_iters=7' in cfg.pretty_text and len(calls) == 4


def test_a_config_that_cannot_build_its_model_is_one_line_naming_the_file_before_any_work(tmp_path):
    """A config with a syntax error, a file that is no config, a folder, and a config whose model type nothing
    registers: each a UsageError naming the path (the tools print it as one line, exit 2), where mmengine raised
    with a traceback, the last only after the data and the backbone were prepared."""
    base = CONFIGS / 'fcn_lvvit_s.py'
    (tmp_path / 'syntax.py').write_text('model = dict(type=\n')
    (tmp_path / 'notes.md').write_text('# not a config\n')
    (tmp_path / 'unknown.py').write_text(f"_base_ = [{str(base)!r}]\nmodel = dict(type='NoSuchSegmentor')\n")
    for name, says in (('syntax.py', 'not a readable config (line 1: SyntaxError'), ('notes.md', 'not a config file'),
                       ('unknown.py', "its model type 'NoSuchSegmentor' is no model mmseg or the suite registers")):
        with pytest.raises(UsageError, match=re.escape(f'{tmp_path / name}: {says}')):
            load_config(str(tmp_path / name))
    with pytest.raises(UsageError, match='a folder, not a config file'):
        load_config(str(tmp_path))


@pytest.mark.parametrize('option, says', [
    ('model.type=NoSuchSegmentor', "--cfg-options model.type: 'NoSuchSegmentor' is nothing mmseg, mmengine or the "
                                   'suite registers'),
    ('model.decode_head.type=UPerHeadd', "'UPerHeadd' is nothing mmseg, mmengine or the suite registers; the nearest "
                                         "is 'UPerHead'"),
    ('train_dataloader.batch_sise=2', "--cfg-options train_dataloader.batch_sise: train_dataloader (a data loader) "
                                      "takes no 'batch_sise'; the nearest is 'batch_size'"),
    ('model.decode_head.num_clases=3', "model.decode_head (UPerHead) takes no 'num_clases'; the nearest is "
                                       "'num_classes'"),
    ('optim_wrapper.optimizer.lrr=0.1', "optim_wrapper.optimizer (AdamW) takes no 'lrr'; the nearest is "
                                        "'lr'"),
    ('train_cfg.max_iterss=9', "train_cfg (IterBasedTrainLoop) takes no 'max_iterss'; the nearest is "
                               "'max_iters'"),
    ('train_dataloader.dataset.pipeline.9.scale=2', 'train_dataloader.dataset.pipeline is a list of 7 item(s), '
                                                    'which has no item 9'),
    ('trian_cfg.max_iters=3', "--cfg-options trian_cfg.max_iters: the config takes no 'trian_cfg'; the nearest is "
                              "'train_cfg'"),  # mmengine ignored it: the run trained as the config says
    ('model.backbone.out_indices.1=2', 'model.backbone.out_indices is a tuple, which is set whole'),
    ('default_hooks.loggerr.interval=1', "default_hooks holds no 'loggerr', and a new one needs its type "
                                         "(default_hooks.loggerr.type=...); the nearest is 'logger'"),
    ('default_hooks.checkpoint.intervall=1', "default_hooks.checkpoint (CheckpointHook) takes no 'intervall'; the "
                                             "nearest is 'interval'"),  # its keywords go to Runner.save_checkpoint
    ('optim_wrapper.optimizer.type=AdamWW', "'AdamWW' is nothing mmseg, mmengine or the suite registers; the nearest "
                                            "is 'AdamW'"),  # mmengine's own registry, the parent of mmseg's
    ('train_dataloader.dataset.pipeline.2.type=RandomResizee', "the nearest is 'RandomResize'")])
def test_cfg_options_are_checked_as_a_config_file_is(option, says):
    """A misspelt key or an unknown type given on the command line was merged as it was: mmengine failed when it
    built the object (a TypeError after the config dump, a log folder left), or built another model."""
    from mmengine.config import DictAction
    key, value = option.split('=')
    parsed = {key: DictAction._parse_iterable(value)}
    with pytest.raises(UsageError, match=re.escape(says)):
        load_config(str(CONFIGS / 'upernet_lvvit_s.py'), parsed)


def test_cfg_options_that_exist_or_are_new_under_open_keywords_merge():
    """Existing keys, keys a class takes that the config leaves out, and keys under a dict no class defines
    (a timm model's keyword arguments) merge as before."""
    cfg = load_config(str(CONFIGS / 'upernet_lvvit_s.py'), {
        'train_dataloader.batch_size': 4, 'train_dataloader.prefetch_factor': 3,
        'model.decode_head.dropout_ratio': 0.2, 'model.backbone.model_kwargs': dict(depth=2),
        'default_hooks.mine.type': 'CheckpointHook', 'default_hooks.mine.interval': 5, 'load_from': None,
        'param_scheduler.0.convert_to_iter_based': False, 'optim_wrapper.paramwise_cfg.norm_decay_mult': 0.0})
    assert cfg.train_dataloader.batch_size == 4 and cfg.train_dataloader.prefetch_factor == 3
    assert cfg.model.decode_head.dropout_ratio == 0.2 and cfg.model.backbone.model_kwargs == dict(depth=2)
    assert cfg.default_hooks.mine == dict(type='CheckpointHook', interval=5)


def test_configs_from_before_the_move_import_every_module_the_changelog_lists(tmp_path):
    """Every module path of CHANGELOG.md's 0.2.0 table under a former top-level package is rewritten to the path the
    table gives, which imports; a config naming the renamed ones loads, and one naming a module that does not
    import is one line naming the config and the module."""
    table = re.findall(r'^\| `([a-z_.]+)` \| `([a-z_.]+)` \|$', (ROOT / 'CHANGELOG.md').read_text(), re.MULTILINE)
    moved = [(before, now) for before, now in table if before.split('.')[0] in FORMER_PACKAGES]
    assert ('segmentation.notices', 'backbones.segmentation.silenced_warnings') in moved and len(moved) > 40
    assert ('backbones.segmentation.semantic.own_data', 'backbones.dense.own_data') in table
    for before, now in moved:  # 0.2.0's paths, where the dense stack was `backbones.segmentation`: moved on since
        assert present_module(before) == present_module(now), before
        importlib.import_module(present_module(now))
    for before, now in table:
        if before.startswith('backbones.segmentation'):
            assert present_module(before) == now, before
            importlib.import_module(now)
    base = CONFIGS / 'upernet_lvvit_s.py'
    (tmp_path / 'before.py').write_text(f"_base_ = [{str(base)!r}]\ncustom_imports = dict(imports=['segmentation', "
                                        "'segmentation.release', 'segmentation.notices'])\n")
    assert load_config(str(tmp_path / 'before.py')).custom_imports['imports'] == [
        'backbones.dense', 'backbones.dense.released_segmentors',
        'backbones.dense.silenced_warnings']
    (tmp_path / 'unknown.py').write_text(f"_base_ = [{str(base)!r}]\n"
                                         "custom_imports = dict(imports=['segmentation.nowhere'])\n")
    with pytest.raises(UsageError, match=re.escape(f"{tmp_path / 'unknown.py'}: custom_imports names "
                                                   "segmentation.nowhere (looked for as backbones.dense.nowhere,"
                                                   " where the suite's modules moved), which does not import")):
        load_config(str(tmp_path / 'unknown.py'))
    assert present_module('segmentation.release.sub') == 'backbones.dense.released_segmentors.sub'
    assert present_module('mmseg.models') == 'mmseg.models'  # another package's module as it is
