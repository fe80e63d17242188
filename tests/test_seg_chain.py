"""The chain the suite is for: `make run`'s path on the embedded digits (their annotator, its token labels,
token-labeled training), the pretraining feeding segmentation, and the fallback schedule."""
from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from mmengine.optim import build_optim_wrapper
from mmengine.registry import init_default_scope

import backbones.dense  # noqa: F401  (first: it lets mmseg import on mmcv-lite; registers the suite's modules)

# isort: split
from mmseg.registry import MODELS

from backbones import create_model
from backbones.common.distributed import DistInfo
from backbones.common.errors import CheckpointError, UsageError
from backbones.common.images import scan_split
from backbones.dense import test as tester  # its prepare and parser: pytest would collect test_* names
from backbones.dense.semantic.task import ADE20KLayout, OwnSegLayout
from backbones.dense.train import Pretraining, build_parser, prepare, train
from backbones.dense.tta import tta_flips
from classification.digits.cls_data import (
    FINISHED,
    NEW,
    RECIPE,
    STOPPED,
    EmbeddedScans,
    pretraining_recipe,
    pretraining_state,
)
from classification.digits.pages import CLASSES, write_digits_ade
from classification.digits.seg_data import RATIO_RANGE, SCALE, TEST_RATIOS, EmbeddedPages, Schedule
from classification.engine.checkpoints import BEST, LAST, LOG, METRICS
from classification.token_labeling.label_store import TokenLabelStore
from classification.train import prepare_embedded_data
from helpers.commands import ENV, ROOT, run_python, run_tool, succeeded
from helpers.seg_data import CONFIGS, TINY_MODELS, tiny_model_overrides, write_tiny_ade
from helpers.shared import built_once
from helpers.training_runs import assert_same_run

ADE20K_ROOT, OWN_DATA_ROOT = ADE20KLayout.root, OwnSegLayout.root  # the folders the embedded data stands in for
pytestmark = pytest.mark.slow  # tools run end to end here: make test-fast leaves this file out
# every test here but make run's runs a segmentation config on the embedded data, which ADE20K on disk replaces
on_the_fallback = pytest.mark.skipif((ROOT / ADE20K_ROOT).is_dir(), reason='ADE20K is on disk: no fallback to test')
SCHEDULE = Schedule()

CONFIG = 'upernet_lvvit_s.py'
ITERS = 400
# A 32-wide, 4-block backbone learns at a larger lr than the embedded schedule's (set for LV-ViT-S to L).
TINY_SCHEDULE = ('optim_wrapper.optimizer.lr=0.003', 'model.decode_head.dropout_ratio=0',
                 'model.auxiliary_head.dropout_ratio=0')


def tiny_digits_config(path: Path, config: str = CONFIG) -> Path:
    """A tiny version of a real config that keeps its ImageNet `pretrained` path (absent here) and data root."""
    model = tiny_model_overrides(config)
    del model['backbone']['pretrained']
    lines = [f'_base_ = [{str(CONFIGS / config)!r}]', f'model = {model!r}',
             "train_dataloader = dict(num_workers=0, persistent_workers=False)",
             "val_dataloader = dict(num_workers=0, persistent_workers=False)",
             "test_dataloader = val_dataloader"]
    path.write_text('\n'.join(lines) + '\n')
    return path


def embedded(root: Path, pages: Path | None = None) -> EmbeddedPages:
    """The embedded pages (under `root`, or `pages` already written) and scans under `root`."""
    return EmbeddedPages(pages or root / 'digits_seg', EmbeddedScans(root / 'digits'))


@pytest.fixture(scope='module')
def pages(tmp_path_factory) -> Path:
    """The embedded pages written once for the session, for the tests that read them only."""
    return built_once(tmp_path_factory, 'digits_pages', lambda folder: write_digits_ade(folder / 'pages')) / 'pages'


@pytest.fixture
def prepared(tmp_path, pages):
    """train_seg's config for some arguments (a work dir under `tmp_path` unless they name one), on the pages."""
    def prepared(*argv, config: Path = CONFIGS / CONFIG):
        work = [] if '--work-dir' in argv else ['--work-dir', str(tmp_path / 'work')]
        return prepare(build_parser().parse_args([str(config), *work, *argv]), embedded(tmp_path, pages)).cfg
    return prepared


@on_the_fallback
def test_digits_fallback_takes_its_schedule(prepared, pages):
    cfg = prepared('--cfg-options', 'model.backbone.pretrained=None')
    assert cfg.train_dataloader.dataset.metainfo.classes == CLASSES
    assert cfg.train_dataloader.dataset.data_root == str(pages)
    assert cfg.train_cfg.max_iters == SCHEDULE.iters
    assert cfg.train_cfg.val_interval == SCHEDULE.val_interval
    assert cfg.optim_wrapper.optimizer.lr == SCHEDULE.lr
    assert cfg.train_dataloader.batch_size == SCHEDULE.batch_size
    warmup, decay = cfg.param_scheduler
    assert (warmup.end, decay.begin, decay.end) == (SCHEDULE.warmup_iters, SCHEDULE.warmup_iters,
                                                   SCHEDULE.iters)
    assert cfg.default_hooks.checkpoint.interval == SCHEDULE.checkpoint_interval
    # --amp left out is auto: float32 (the config's OptimWrapper) on a CPU, mixed precision on a GPU
    assert cfg.optim_wrapper.type == ('AmpOptimWrapper' if torch.cuda.is_available() else 'OptimWrapper')
    assert cfg.model.backbone.pretrained is None
    resize = next(step for step in cfg.train_dataloader.dataset.pipeline if step.type == 'RandomResize')
    assert tuple(resize.ratio_range) == RATIO_RANGE


@on_the_fallback
def test_resume_before_the_first_checkpoint_removes_the_torn_write_and_says_it_starts_over(tmp_path, caplog, prepared):
    """A run killed while writing its first checkpoint leaves only a temporary file: --resume removes it and says
    the run starts from iteration 0 (it once started over in silence, the file left behind)."""
    work = tmp_path / 'work'
    work.mkdir()
    torn = work / '.iter_16000.pth.tmp4242'
    torn.write_bytes(b'half a checkpoint')
    prepared('--work-dir', str(work), '--resume', '--cfg-options', 'model.backbone.pretrained=None')
    assert not torn.exists()
    assert f'--resume: {work} holds no checkpoint' in caplog.text and 'starting from iteration 0' in caplog.text


@on_the_fallback
def test_a_run_torchrun_restarts_resumes_by_itself(tmp_path, monkeypatch, caplog, prepared):
    """Under torchrun --max-restarts a restarted run continues from its work dir without --resume; a new command on
    the same work dir is still refused."""
    work = tmp_path / 'work'
    work.mkdir()
    (work / 'last_checkpoint').write_text(str(work / 'iter_8.pth'))
    with pytest.raises(UsageError, match='already holds a run: add --resume'):
        prepared('--work-dir', str(work), '--cfg-options', 'model.backbone.pretrained=None')
    monkeypatch.setenv('TORCHELASTIC_RESTART_COUNT', '1')
    with caplog.at_level('INFO', logger='vit_dense'):
        cfg = prepared('--work-dir', str(work), '--cfg-options', 'model.backbone.pretrained=None')
    assert cfg.resume and f'torchrun restarted the run: resuming from the latest checkpoint in {work}' in caplog.text


@on_the_fallback
def test_a_resumed_run_keeps_the_seed_it_drew(tmp_path, prepared):
    """A config without a seed (ADE20K's; the digits fallback sets one): a new run leaves it to mmengine, which draws
    one for every process (the main one's) and records it in every checkpoint; --resume takes it from the run's newest
    checkpoint: the sampler's order and the workers' augmentation go on as they were."""
    data = write_tiny_ade(tmp_path / 'ade')
    work, options = tmp_path / 'work', ('--data-root', str(data), '--cfg-options', 'model.backbone.pretrained=None')
    assert prepared('--work-dir', str(work), *options).randomness.seed is None
    drawn = 1234567
    work.mkdir(exist_ok=True)
    torch.save({'meta': {'seed': drawn}}, work / 'iter_8.pth')
    (work / 'last_checkpoint').write_text(str(work / 'iter_8.pth'))
    assert prepared('--work-dir', str(work), '--resume', *options).randomness.seed == drawn


@on_the_fallback
def test_train_seg_refuses_a_schedule_it_cannot_resume_exactly(tmp_path, prepared):
    with pytest.raises(UsageError, match='EpochBasedTrainLoop: train_seg runs iteration-based schedules'):
        prepared('--cfg-options', 'model.backbone.pretrained=None', 'train_cfg.type=EpochBasedTrainLoop')


@on_the_fallback
def test_digits_are_never_mirrored_in_training_or_testing(tmp_path, prepared):
    cfg = prepared('--cfg-options', 'model.backbone.pretrained=None')
    flips = [step for step in cfg.train_dataloader.dataset.pipeline if step.type == 'RandomFlip']
    assert flips and all(step.prob == 0 for step in flips)
    assert not tta_flips(cfg)
    tta = next(step for step in cfg.tta_pipeline if step.type == 'TestTimeAug')
    assert len(tta.transforms[0]) == len(TEST_RATIOS)  # every scale is kept
    data = write_tiny_ade(tmp_path / 'ade')  # the papers' flips stay on real data
    cfg = prepared('--data-root', str(data), '--cfg-options', 'model.backbone.pretrained=None')
    assert tta_flips(cfg)
    assert [step.prob for step in cfg.train_dataloader.dataset.pipeline if step.type == 'RandomFlip'] == [0.5]


@on_the_fallback
def test_the_multi_scale_test_on_the_pages_takes_the_sizes_training_saw(tmp_path, prepared):
    """ADE20K's ratios 0.75-1.75 of the single-scale size become TEST_RATIOS of the pages' single-scale size, the
    range the pages' training resizes over; the real data keeps the config's."""
    cfg = prepared('--cfg-options', 'model.backbone.pretrained=None')
    single = next(step.scale for step in cfg.test_dataloader.dataset.pipeline if step.type == 'Resize')
    tta = next(step for step in cfg.tta_pipeline if step.type == 'TestTimeAug')
    assert [tuple(step['scale']) for step in tta.transforms[0]] == [(round(single[0] * r), round(single[1] * r))
                                                                for r in TEST_RATIOS]
    assert min(TEST_RATIOS) >= RATIO_RANGE[0] and max(TEST_RATIOS) <= RATIO_RANGE[1] and 1.0 in TEST_RATIOS
    data = write_tiny_ade(tmp_path / 'ade')
    cfg = prepared('--data-root', str(data), '--cfg-options', 'model.backbone.pretrained=None')
    tta = next(step for step in cfg.tta_pipeline if step.type == 'TestTimeAug')
    assert [tuple(step['scale']) for step in tta.transforms[0]] == [(int(2048 * r), int(512 * r))
                                                                for r in (0.75, 1.0, 1.25, 1.5, 1.75)]


@on_the_fallback
def test_on_the_digits_schedule_neck_and_heads_learn_faster_than_the_backbone(tmp_path, prepared):
    config = tiny_digits_config(tmp_path / 'tiny.py')
    cfg = prepared('--cfg-options', 'model.backbone.pretrained=None', config=config)
    init_default_scope('mmseg')
    model = MODELS.build(cfg.model)
    optimizer = build_optim_wrapper(model, cfg.optim_wrapper).optimizer
    lr_of = {id(p): group['lr'] for group in optimizer.param_groups for p in group['params']}
    for name, param in model.named_parameters():
        part = name.split('.')[0]
        expected = SCHEDULE.lr * (1 if part == 'backbone' else SCHEDULE.head_lr_mult)
        assert lr_of[id(param)] == pytest.approx(expected), name


@on_the_fallback
def test_explicit_options_win_over_the_fallback_schedule(tmp_path, prepared):
    cfg = prepared('--cfg-options', 'model.backbone.pretrained=None',
                   'optim_wrapper.optimizer.lr=0.001', 'train_dataloader.batch_size=3')
    assert cfg.optim_wrapper.optimizer.lr == 0.001 and cfg.train_dataloader.batch_size == 3
    assert cfg.train_cfg.max_iters == SCHEDULE.iters
    cfg = prepared('--iters', '30', '--cfg-options', 'model.backbone.pretrained=None')
    assert cfg.train_cfg.max_iters == 30 and cfg.param_scheduler[-1].end == 30
    assert cfg.param_scheduler[0].end == round(SCHEDULE.warmup_iters * 30 / SCHEDULE.iters)


@pytest.mark.skipif((ROOT / OWN_DATA_ROOT).is_dir(), reason='a data set of your own is on disk: no fallback to test')
@on_the_fallback
def test_an_own_data_config_without_its_data_runs_on_the_digits(tmp_path, prepared):
    cfg = prepared('--cfg-options', 'model.backbone.pretrained=None',
                   config=CONFIGS / 'upernet_lvvit_s_own_data.py')
    assert cfg.train_dataloader.dataset.metainfo.classes == CLASSES
    assert cfg.model.decode_head.num_classes == len(CLASSES)
    assert cfg.train_cfg.max_iters == SCHEDULE.iters  # the pages' schedule, not one sized by own_data


@on_the_fallback
def test_real_data_keeps_the_config_schedule(tmp_path, prepared):
    data = write_tiny_ade(tmp_path / 'ade')
    cfg = prepared('--data-root', str(data), '--cfg-options', 'model.backbone.pretrained=None')
    assert cfg.train_cfg.max_iters == 160000 and cfg.optim_wrapper.optimizer.lr == 6e-5
    assert cfg.train_dataloader.dataset.type == 'ADE20KDataset'


@on_the_fallback
def test_a_missing_backbone_file_given_on_the_command_line_is_an_error(tmp_path, prepared):
    with pytest.raises(CheckpointError, match='nowhere.pth'):
        prepared('--cfg-options', 'model.backbone.pretrained=nowhere.pth')


@pytest.mark.skipif((ROOT / OWN_DATA_ROOT).is_dir(), reason='a data set of your own is on disk: no fallback to test')
@pytest.mark.parametrize('config, reason', [
    (CONFIG, 'pretrained/lvvit_s-26M-224-83.3.pth.tar not found'),
    ('upernet_lvvit_s_own_data.py', 'timm (the ImageNet release) left aside on the embedded data')])
@on_the_fallback
def test_the_segmentation_trainer_asks_for_the_pretraining_and_trains_nothing_itself(tmp_path, pages, config,
                                                                                     reason):
    """Control runs one way: on the embedded set, a config whose ImageNet weights are not there comes back from
    `prepare` with the pretraining its tool is to run first (nothing trained, no scans written), and the trainer
    starts from the checkpoint that stage gives it, refusing to start without one."""
    run = prepare(build_parser().parse_args([str(CONFIGS / config), '--work-dir', str(tmp_path / 'work')]),
                  embedded(tmp_path, pages))
    assert run.pretraining == Pretraining('lvvit_s', {}, reason)
    assert not (tmp_path / 'digits').exists()
    with pytest.raises(UsageError, match=f'backbone: {re.escape(reason)}: pretrain lvvit_s first and pass its '
                                         'checkpoint'):
        train(run)
    given = prepare(build_parser().parse_args([str(CONFIGS / config), '--work-dir', str(tmp_path / 'other'),
                                               '--cfg-options', 'model.backbone.pretrained=None']),
                    embedded(tmp_path, pages))
    assert given.pretraining is None and given.cfg.model.backbone.pretrained is None


@on_the_fallback
def test_cfg_options_are_applied_once_so_train_seg_and_test_seg_run_one_config(tmp_path, pages, prepared):
    """A --cfg-options value the embedded set transforms (a size: scaled to the pages) is applied once, before the
    scaling, as test_seg applies it: the single-scale test size of train_seg's config (the one its work dir keeps) is
    test_seg's, and the multi-scale sizes are its ratios. Merged a second time after the embedded set's changes, the
    option undid the scaling of the test size (1024 x 256 tested on 48 px pages) but not of the multi-scale sizes
    derived from it."""
    options = ('--cfg-options', 'model.backbone.pretrained=None', 'test_dataloader.dataset.pipeline.1.scale=(1024,256)')
    trained = prepared(*options)
    checkpoint = tmp_path / 'segmentor.pth'
    torch.save({'state_dict': {'decode_head.conv_seg.bias': torch.zeros(len(CLASSES))}}, checkpoint)
    tested = tester.prepare(tester.build_parser().parse_args([str(CONFIGS / CONFIG), str(checkpoint), *options]),
                          embedded(tmp_path, pages))
    size = (round(1024 * SCALE), round(256 * SCALE))
    assert [step.get('scale') for step in trained.test_dataloader.dataset.pipeline] == [None, size, None, None]
    assert trained.test_dataloader.dataset.pipeline == tested.test_dataloader.dataset.pipeline
    tta = next(step for step in trained.tta_pipeline if step.type == 'TestTimeAug')
    assert [tuple(step['scale']) for step in tta.transforms[0]] == [(round(size[0] * r), round(size[1] * r))
                                                                for r in TEST_RATIOS]
    assert trained.tta_pipeline == tested.tta_pipeline


def make_run_command() -> list:
    """What `make run` runs (the Makefile's `run` recipe), without the interpreter."""
    recipe = re.search(r'^run:.*\n\t\$\(PY\) (.+)$', (ROOT / 'Makefile').read_text(), re.M)
    return recipe.group(1).split()


@pytest.fixture(scope='module')
def labeled_digits(tmp_path_factory) -> Path:
    """The first part of `make run`'s path, in process, as the command runs it (`prepare_embedded_data` with the
    recipe it trains LV-ViT with): the digits folder, the resnet10t annotator trained on it, its token labels for
    every training image."""
    digits = tmp_path_factory.mktemp('make_run') / 'digits'
    prepare_embedded_data(EmbeddedScans(digits), pretraining_recipe('lvvit_s', {}), DistInfo(), workers=0)
    return digits


def test_make_runs_annotator_labels_the_digits_it_sees(labeled_digits):
    annotator = json.loads((labeled_digits / 'annotator' / 'metrics.json').read_text())
    assert annotator['model'] == 'resnet10t' and annotator['top1'] > 90  # it labels the digits it sees
    store = TokenLabelStore(labeled_digits / 'token_labels')
    _, train = scan_split(labeled_digits / 'images', 'train')
    store.rows_of([path for path, _ in train])
    assert len(store) == len(train) and store.grid == (3, 3) and store.meta['topk'] == 5  # 48 px, stride 16


@pytest.fixture(scope='module')
def made_run(labeled_digits, tmp_path_factory):
    """`make run` end to end with a tiny LV-ViT on the digits, their annotator and labels made above: it keeps what
    is on disk, and trains LV-ViT with token labeling from them."""
    command = make_run_command()
    assert command == ['tools/train_cls.py', 'lvvit_s']
    out = tmp_path_factory.mktemp('made_run') / 'run'
    result = succeeded(run_python([*command, '--digits-dir', labeled_digits, '--output', out, '--epochs', '2',
                                   '--workers', '0', '--model-kwargs', 'depth=2', 'embed_dim=64', 'num_heads=2'],
                                  timeout=900))
    return labeled_digits, out, result.stdout


def test_make_run_path_at_a_tiny_size(made_run):
    digits, out, stdout = made_run
    assert 'digits: training the annotator' not in stdout and 'generating token labels' not in stdout  # kept
    metrics = json.loads((out / 'metrics.json').read_text())
    assert metrics['token_labeling'] and metrics['epochs'] == 2 and metrics['model'] == 'lvvit_s'
    log = [json.loads(line) for line in (out / 'log.jsonl').read_text().splitlines()]
    assert [r['epoch'] for r in log] == [1, 2] and log[1]['train_loss'] < log[0]['train_loss']
    # chance is 10%; a 2-block model after 2 epochs reaches about 30% (28.3% and above 30% with two seedings)
    assert metrics['best_top1'] > 20, metrics
    assert 'done: top-1' in stdout


# What `make run` made before its LV-ViT's training: a segmentation config's pretraining on the digits starts from it
DIGITS_LABELED = ('images', 'annotator', 'token_labels')


@pytest.fixture(scope='module')
def chain(made_run, tmp_path_factory):
    """tools/train_seg.py on the embedded set with a tiny LV-ViT: its backbone is pretrained on the embedded
    classification digits on first use (token-labeled training, from the annotator and labels `make run` made),
    then segmentation trains from it."""
    root = tmp_path_factory.mktemp('chain')
    for part in DIGITS_LABELED:
        shutil.copytree(made_run[0] / part, root / 'digits' / part)
    config = tiny_digits_config(root / 'tiny_upernet_lvvit.py')
    result = run_tool('train_seg.py', [config, '--iters', ITERS, '--work-dir', root / 'work', '--digits-dir',
                                       root / 'digits', '--digits-seg-dir', root / 'digits_seg', '--cfg-options',
                                       *TINY_SCHEDULE], timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return root, config, result.stdout + result.stderr


@on_the_fallback
def test_segmentation_starts_from_the_digits_pretrained_backbone(chain):
    root, _, log = chain
    checkpoint = pretraining_dir(root / 'digits') / 'best.pth'
    assert ('backbone: pretrained/lvvit_s-26M-224-83.3.pth.tar not found; lvvit_s pretrained on the embedded '
            'digits (token-labeling, best val top-1') in log and f'from {checkpoint}' in log
    assert f'TokenBackbone: loaded {checkpoint}' in log
    assert f'schedule: {ITERS} iterations' in log  # --iters shortens the embedded set's schedule
    assert checkpoint.is_file() and (root / 'work' / f'iter_{ITERS}.pth').is_file()


def background_only_miou(annotations: Path) -> float:
    """The mIoU (percent) of predicting background everywhere: background's IoU is its share of the labelled
    pixels, every digit's IoU is 0."""
    labels = np.concatenate([cv2.imread(str(path), cv2.IMREAD_UNCHANGED).ravel() for path in annotations.glob('*.png')])
    labelled = (labels >= 1).sum()  # 0 is ignored (reduce_zero_label)
    return 100 * (labels == 1).sum() / labelled / len(CLASSES)


@on_the_fallback
def test_segmentation_from_the_pretrained_backbone_finds_digits(chain):
    """The shortened run predicts more than background: mIoU above what predicting background everywhere scores,
    with digit pixels found (a 4-block, 32-wide backbone in 400 iterations only begins to tell the digits apart;
    that segmentation learns them is shown by the full-size runs in the README, 77.7 mIoU for LV-ViT-S)."""
    root, _, log = chain
    miou = float(re.findall(r'Iter\(val\) \[\d+/\d+\]\s+aAcc: [\d.]+\s+mIoU: ([\d.]+)', log)[-1])
    floor = background_only_miou(root / 'digits_seg' / 'annotations' / 'validation')
    assert 6 < floor < 8
    assert miou > floor + 2, (miou, floor)
    digit_ious = [float(iou) for iou in re.findall(r'\|\s+\d\s+\|\s+([\d.]+)\s+\|', log)[-10:]]
    assert len(digit_ious) == 10 and max(digit_ious) > 10, digit_ious


@on_the_fallback
def test_a_checkpoint_of_the_embedded_pages_predicts_from_the_folder_it_was_trained_on(chain, tmp_path):
    """predict_seg, run from another folder on a checkpoint trained on the pages in a folder of its own: the pages are
    read where the checkpoint says they are, not written again under that folder's data/."""
    root, config, _ = chain
    checkpoint = sorted((root / 'work').glob('iter_*.pth'))[-1]
    image = sorted((root / 'digits_seg' / 'images' / 'validation').glob('*.jpg'))[0]
    result = succeeded(run_tool('predict_seg.py', [config, checkpoint, image, '--out', tmp_path / 'masks'],
                                cwd=tmp_path))
    assert f'the embedded digits pages in {root / "digits_seg"}' in result.stdout + result.stderr
    assert (tmp_path / 'masks' / f'{image.stem}.png').is_file() and not (tmp_path / 'data').exists()


@on_the_fallback
def test_pretrained_checkpoint_hands_every_backbone_key_over(chain):
    root, _, _ = chain
    checkpoint = pretraining_dir(root / 'digits') / 'best.pth'
    weights = torch.load(checkpoint, map_location='cpu', weights_only=True)['state_dict']
    metrics = json.loads((checkpoint.parent / 'metrics.json').read_text())
    assert metrics['token_labeling'] and metrics['preset'] == 'token-labeling'
    init_default_scope('mmseg')
    backbone_cfg = dict(tiny_model_overrides(CONFIG)['backbone'], type='TokenBackbone', model_name='lvvit_s',
                        pretrained=str(checkpoint))
    backbone = MODELS.build(backbone_cfg)
    backbone.init_weights()
    state = backbone.model.state_dict()
    reference = create_model('lvvit_s', num_classes=0, img_size=48, **TINY_MODELS[CONFIG])
    assert set(state) <= set(weights)
    for key, value in state.items():
        if key == 'pos_embed':  # resampled from the 3x3 grid of the 48 px pretraining
            assert value.shape != weights[key].shape
            continue
        assert torch.equal(value, weights[key]), key
    assert set(state) <= set(reference.state_dict())


# The first stage the chain's tiny config asks for
TINY_PRETRAINING = Pretraining('lvvit_s', TINY_MODELS[CONFIG], 'pretrained/lvvit_s-26M-224-83.3.pth.tar not found')


def pretraining_dir(digits: Path) -> Path:
    """Where the chain's tiny LV-ViT is pretrained on the scans in `digits`."""
    return EmbeddedScans(digits).pretraining_dir('lvvit_s', TINY_PRETRAINING.model_kwargs)


def test_a_pretraining_is_kept_for_the_same_model_arguments_recipe_and_scans_only(tmp_path, monkeypatch):
    """The folder was the model's name: a pretraining made with other model arguments (a wider LV-ViT) was taken
    for this one's, its weights loaded into a model they do not fit, or worse, one they do."""
    from classification.digits import cls_data
    scans = EmbeddedScans(tmp_path)
    tiny = scans.pretraining_dir('lvvit_s', {'embed_dim': 48})
    assert tiny == scans.pretraining_dir('lvvit_s', {'embed_dim': 48}) and tiny.name.startswith('lvvit_s-')
    others = {scans.pretraining_dir('lvvit_s', {'embed_dim': 96}), scans.pretraining_dir('lvvit_m', {'embed_dim': 48}),
              EmbeddedScans(tmp_path, 'resnet18').pretraining_dir('lvvit_s', {'embed_dim': 48})}
    monkeypatch.setattr(cls_data, 'RECIPE', {**cls_data.RECIPE, 'epochs': 9})
    others.add(scans.pretraining_dir('lvvit_s', {'embed_dim': 48}))
    monkeypatch.setattr(cls_data, 'RECIPE', RECIPE)
    monkeypatch.setattr(cls_data, 'VERSION', 'another version of the scans')
    others.add(scans.pretraining_dir('lvvit_s', {'embed_dim': 48}))
    assert len(others) == 5 and tiny not in others


@on_the_fallback
def test_the_log_names_each_stage_and_where_the_backbone_comes_from(chain):
    root, _, log = chain
    folder = pretraining_dir(root / 'digits')
    first = log.index('stage 1 of 2: pretraining lvvit_s with token labeling on the embedded digits for the '
                      f'segmentation backbone -> {folder}')
    assert log.index(f'stage 2 of 2: the segmentor, its backbone from {folder / BEST}') > first


@on_the_fallback
def test_a_second_run_keeps_the_pretraining_the_first_made(chain, caplog):
    root, _, _ = chain
    checkpoint = pretraining_dir(root / 'digits') / BEST
    before = checkpoint.read_bytes(), checkpoint.stat().st_mtime_ns
    with caplog.at_level('INFO', logger='vit_dense'):
        backbone = embedded(root).pretrained_backbone(TINY_PRETRAINING)
    assert backbone.checkpoint == checkpoint and (checkpoint.read_bytes(), checkpoint.stat().st_mtime_ns) == before
    assert (f'stage 1 of 2: lvvit_s pretrained on the embedded digits, kept from an earlier run in '
            f'{checkpoint.parent}') in caplog.text
    assert 'training' not in caplog.text and 'pretraining lvvit_s' not in caplog.text
    assert backbone.origin.startswith('lvvit_s pretrained on the embedded digits (token-labeling, best val top-1')


@on_the_fallback
def test_a_pretraining_whose_file_does_not_read_is_done_again(chain, tmp_path, caplog):
    """A finished pretraining is kept, a stopped one (no metrics.json: they are written last) continued; one whose
    checkpoint does not read (best.pth of a finished run, last.pth of a stopped one) is removed, to be done again,
    with a warning naming the file."""
    root, _, _ = chain
    digits = tmp_path / 'digits'
    shutil.copytree(root / 'digits' / 'images', digits / 'images')
    run = pretraining_dir(digits)
    for damaged, expected in ((None, FINISHED), (BEST, NEW), (LAST, NEW)):
        shutil.copytree(pretraining_dir(root / 'digits'), run, dirs_exist_ok=True)
        if damaged == LAST:
            (run / METRICS).unlink()
            assert pretraining_state(digits, run) == STOPPED
        if damaged:
            content = (run / damaged).read_bytes()
            (run / damaged).write_bytes(content[:len(content) // 2])
        assert pretraining_state(digits, run) == expected, damaged
        assert run.is_dir() == (expected != NEW)
        if damaged:
            assert f'warning: {run / damaged}: not a readable' in caplog.text and 'starts again' in caplog.text


@on_the_fallback
def test_a_stop_in_the_pretraining_stops_the_command_and_the_next_run_continues_it_exactly(chain, tmp_path):
    """The first stage is train_cls's training: a SIGTERM there writes its checkpoint and stops the command (status
    75) before any segmentation, and the stopped pretraining is not taken for a finished one: the same command again
    continues it to the log and weights of the run never stopped (the chain's), then trains the segmentor from it."""
    root, config, _ = chain
    digits = tmp_path / 'digits'
    for part in DIGITS_LABELED:  # the pretraining starts at once
        shutil.copytree(root / 'digits' / part, digits / part)
    run, work = pretraining_dir(digits), tmp_path / 'work'
    argv = [config, '--iters', 1, '--work-dir', work, '--digits-dir', digits, '--digits-seg-dir', root / 'digits_seg',
            '--cfg-options', *TINY_SCHEDULE]
    proc = subprocess.Popen([sys.executable, str(ROOT / 'tools' / 'train_seg.py'), *map(str, argv)], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 600
    while not (run / LOG).exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)  # the first epoch is done
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 75, output[-3000:]
    assert 'SIGTERM at epoch' in output and 'Traceback' not in output and 'stage 2 of 2' not in output
    assert "interrupted: stage 1 of 2 (the backbone's pretraining): SIGTERM at epoch" in output
    assert 'the same command again continues it' in output and '--resume' not in output  # it continues by itself
    assert pretraining_state(digits, run) == STOPPED and not list(work.glob('*.pth'))
    resumed = succeeded(run_tool('train_seg.py', argv, timeout=900))
    log = resumed.stdout + resumed.stderr
    assert f'stage 1 of 2: continuing the stopped pretraining of lvvit_s on the embedded digits in {run}' in log
    assert f'resumed {run / LAST} after' in log
    assert f'stage 2 of 2: the segmentor, its backbone from {run / BEST}' in log
    straight = pretraining_dir(root / 'digits')
    assert_same_run(straight, run, epochs=RECIPE['epochs'])
    weights = [torch.load(folder / BEST, weights_only=True)['state_dict'] for folder in (straight, run)]
    assert weights[0].keys() == weights[1].keys() and all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
