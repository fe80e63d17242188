"""The segmentation reports and the flags mmseg's users type (issue 47): the confusion matrix of test_seg's report
and its picture, a segmentor's MACs with attention counted, the config's test_evaluator honoured, --tta and mmseg's
other flags, and the runs logged to Weights & Biases and MLflow (their real clients, offline)."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

import backbones.dense  # noqa: F401  (registers the suite's mmseg modules)
from backbones.common.errors import DataError, TrackerError, UsageError
from backbones.dense import test as tester  # its prepare and parser: pytest would collect test_* names
from backbones.dense.semantic.metric import IoUReport, read_confusion, top_confusions
from helpers.seg_data import DIM, tiny_config, write_tiny_ade, write_tiny_config
from helpers.trackers import wandb_history

CLASSES = ['sky', 'road', 'car']


def sample(pred: list, label: list) -> dict:
    return dict(pred_sem_seg=dict(data=torch.tensor(pred)[None]), gt_sem_seg=dict(data=torch.tensor(label)[None]),
                img_path='x.jpg')


def test_the_report_holds_the_confusion_matrix_and_the_configs_dice(tmp_path):
    """Two images' pixels, counted by hand: ignored pixels (255) left out; the matrix's diagonal and sums are the
    areas mmseg's IoU is made of; mDice as the config asks (2|A∩B| / (|A| + |B|), averaged)."""
    metric = IoUReport(json_file=str(tmp_path / 'r.json'), iou_metrics=['mIoU', 'mDice'])
    metric.dataset_meta = dict(classes=CLASSES)
    metric.process({}, [sample([[0, 1], [1, 2]], [[0, 0], [1, 255]])])
    metric.process({}, [sample([[2, 2], [0, 0]], [[2, 1], [0, 0]])])
    scores = metric.evaluate(2)
    report = json.loads((tmp_path / 'r.json').read_text())
    counts = [[3, 1, 0], [0, 1, 1], [0, 0, 1]]  # row: ground truth, column: prediction
    assert report['confusion']['counts'] == counts
    assert report['confusion']['normalised'] == [[0.75, 0.25, 0], [0, 0.5, 0.5], [0, 0, 1]]
    dice = [2 * 3 / (4 + 3), 2 * 1 / (2 + 2), 2 * 1 / (1 + 2)]
    iou = [3 / 4, 1 / 3, 1 / 2]
    assert scores['mDice'] == pytest.approx(100 * np.mean(dice)) and report['mDice'] == scores['mDice']
    assert scores['mIoU'] == pytest.approx(100 * np.mean(iou))
    assert report['per_class']['road']['Dice'] == pytest.approx(100 * dice[1])
    largest = [('road', 'car', 0.5, 1), ('sky', 'road', 0.25, 1)]
    assert top_confusions(*read_confusion(tmp_path / 'r.json'), 2) == largest


def test_the_confusion_picture_is_drawn_and_a_report_without_one_is_named(tmp_path):
    from classification.visualize import main
    report = tmp_path / 'r.json'
    report.write_text(json.dumps({'per_class': {name: {} for name in CLASSES},
                                  'confusion': {'counts': [[5, 1, 0], [0, 4, 2], [0, 0, 0]]}}))
    picture = main(['confusion', str(report), '--top', '3', '--out', str(tmp_path / 'c.png')])
    drawn = plt_read(picture)
    assert drawn.ndim == 3 and drawn.shape[0] > 300
    for content in ({'per_class': {'a': {}}}, {'per_class': {'a': {}}, 'confusion': {'counts': [[1, 2]]}}):
        report.write_text(json.dumps(content))
        with pytest.raises(DataError, match=rf'{report}: not a test_seg.py report with a confusion matrix'):
            main(['confusion', str(report), '--out', str(tmp_path / 'c.png')])


def plt_read(path: Path) -> np.ndarray:
    from matplotlib.image import imread
    return imread(path)


def test_a_segmentors_macs_are_every_layers_products_and_the_attentions():
    """model_info's count of a tiny UperNet + DeiT at 64 x 96, against one made independently: on a real forward
    pass, each linear and convolution layer's multiply-accumulates (forward hooks), and each block's attention
    products, 2 N² D for N tokens (the class token's too) of width D, which module-level counters such as mmseg's
    get_flops leave out."""
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS

    from backbones.dense.complexity import build_meta_model, segmentor_macs
    cfg = tiny_config('upernet_deit_s.py', img_size=64)
    counted = segmentor_macs(cfg, build_meta_model(cfg), (64, 96))

    init_default_scope('mmseg')
    model = MODELS.build(cfg.model).eval()
    layers = 0

    def count(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        nonlocal layers
        if isinstance(module, nn.Linear):
            layers += output.numel() * module.in_features
        elif isinstance(module, nn.ConvTranspose2d):
            layers += inputs[0].numel() * module.out_channels // module.groups * math.prod(module.kernel_size)
        else:
            layers += output.numel() * module.in_channels // module.groups * math.prod(module.kernel_size)

    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Conv2d, nn.ConvTranspose2d)):
            module.register_forward_hook(count)
    with torch.no_grad():
        model(torch.zeros(1, 3, 64, 96), mode='tensor')
    tokens, depth = (64 // 16) * (96 // 16) + 1, 4
    assert counted == layers + depth * 2 * tokens ** 2 * DIM


@pytest.fixture
def tiny_ade(tmp_path):
    data = write_tiny_ade(tmp_path / 'ade', counts=(('training', 2), ('validation', 2)))
    checkpoint = tmp_path / 'segmentor.pth'
    torch.save({'state_dict': {'decode_head.conv_seg.bias': torch.zeros(150)}}, checkpoint)
    return write_tiny_config(tmp_path / 'tiny.py', 'upernet_lvvit_s.py', data), checkpoint


def prepared_test(config: Path, checkpoint: Path, *argv: str):
    return tester.prepare(tester.build_parser().parse_args([str(config), str(checkpoint), *argv]))


def test_test_seg_honours_the_configs_test_evaluator(tiny_ade, tmp_path):
    """mmseg's IoUMetric with the config's settings (mDice, nan_to_num) runs as the suite's report; another metric
    runs as the config gives it, and --out then needs an IoU metric."""
    config, checkpoint = tiny_ade
    out = str(tmp_path / 'r.json')
    cfg = prepared_test(config, checkpoint, '--out', out, '--cfg-options', 'test_evaluator.type=IoUMetric',
                 'test_evaluator.iou_metrics=[mIoU,mDice]', 'test_evaluator.nan_to_num=0')
    assert cfg.test_evaluator == dict(type='IoUReport', iou_metrics=['mIoU', 'mDice'], nan_to_num=0, json_file=out,
                                      output_dir=None)
    assert prepared_test(config, checkpoint).test_evaluator == dict(type='IoUReport', json_file=None, output_dir=None)
    other = ['--cfg-options', 'test_evaluator.type=CityscapesMetric', 'test_evaluator.output_dir=cs']
    assert prepared_test(config, checkpoint, *other).test_evaluator == dict(type='CityscapesMetric', output_dir='cs')
    with pytest.raises(UsageError, match="--out and --pred-dir are written by the IoU metric; the config's "
                                         'test_evaluator is CityscapesMetric'):
        prepared_test(config, checkpoint, '--out', out, *other)


def test_tta_is_the_multi_scale_test_and_show_dir_draws_each_image(tiny_ade, tmp_path):
    """--tta is --ms (mmseg's name for the config's tta_pipeline and tta_model); --show-dir adds the hook that draws
    each test image."""
    config, checkpoint = tiny_ade
    cfg = prepared_test(config, checkpoint, '--tta', '--show-dir', str(tmp_path / 'show'))
    assert cfg.model.type == cfg.tta_model.type and cfg.test_dataloader.dataset.pipeline == cfg.tta_pipeline
    assert cfg.custom_hooks[-1] == dict(type='PredictionPictures', folder=str(tmp_path / 'show'))


@pytest.mark.parametrize('tool, flag, equivalent', [
    ('test_seg', '--show', '--show-dir DIR'), ('test_seg', '--aug-test', '--tta'), ('test_seg', '--opacity', None),
    ('test_seg', '--local-rank', 'torchrun'), ('train_seg', '--load-from', '--cfg-options load_from=CHECKPOINT'),
    ('train_seg', '--local_rank', 'torchrun'), ('predict_seg', '--out-file', '--out FOLDER')])
def test_mmsegs_flags_the_tools_do_not_take_are_one_line_naming_the_equivalent(tool, flag, equivalent, capsys):
    from backbones.dense import masks, train
    parser = {'test_seg': tester, 'train_seg': train, 'predict_seg': masks}[tool].build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(['c.py', 'k.pth', flag, '1'])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f'{tool}.py: error: {flag} is a flag of mmseg')
    assert line.endswith('it has no equivalent here') if equivalent is None else f': use {equivalent}' in line


@pytest.mark.slow
def test_a_run_logs_its_scalars_to_wandb_and_mlflow(tmp_path, monkeypatch):
    """--log-wandb and --log-mlflow: a 2-iteration run's losses and validation scores, as its own scalars.json holds
    them, read back from wandb's offline run and from MLflow's file store, the default one in the work dir (most of
    the test's time is the clients' start); the run's artifacts are its config and logs, not the store's own files."""
    from mlflow.tracking import MlflowClient

    from backbones.dense.runner import SuiteRunner
    from backbones.dense.train import build_parser, prepare
    data = write_tiny_ade(tmp_path / 'ade', counts=(('training', 2), ('validation', 1)))
    config = write_tiny_config(tmp_path / 'tiny.py', 'upernet_lvvit_s.py', data)
    store = f'file://{tmp_path}/work/mlruns'
    for name, value in (('WANDB_MODE', 'offline'), ('WANDB_SILENT', 'true'), ('WANDB_X_DISABLE_STATS', 'true'),
                        ('WANDB_CONSOLE', 'off')):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv('MLFLOW_TRACKING_URI', raising=False)
    args = build_parser().parse_args([str(config), '--work-dir', str(tmp_path / 'work'), '--iters', '2',
                                      '--log-wandb', '--log-mlflow', '--pictures', '0'])
    cfg = prepare(args).cfg
    cfg.visualizer.vis_backends = [b for b in cfg.visualizer.vis_backends if b['type'] != 'TensorboardVisBackend']
    SuiteRunner.from_cfg(cfg).train()
    logged = [json.loads(line) for line in next((tmp_path / 'work').glob('*/vis_data/scalars.json')).open()]
    losses = {row['step']: row['loss'] for row in logged if 'loss' in row}
    miou = next(row['mIoU'] for row in logged if 'mIoU' in row)
    assert sorted(losses) == [1, 2] and miou is not None

    (run_dir,) = (tmp_path / 'work').glob('*/vis_data/wandb/offline-run-*')  # the backend's dir: the work dir's
    history, _ = wandb_history(run_dir)
    assert {row['iter']: row['loss'] for row in history if 'loss' in row} == losses
    assert next(row['mIoU'] for row in history if 'mIoU' in row) == miou
    client = MlflowClient(tracking_uri=store)
    (run,) = client.search_runs([client.get_experiment_by_name('tiny').experiment_id])
    assert run.info.run_name == 'work'
    assert {m.step: m.value for m in client.get_metric_history(run.info.run_id, 'loss')} == pytest.approx(losses)
    assert run.data.metrics['mIoU'] == pytest.approx(miou)
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id)]
    assert 'config.py' in artifacts and not any(path.startswith('mlruns') for path in artifacts), artifacts


def test_a_tracker_not_installed_is_one_line_naming_the_extra(tiny_ade, tmp_path, monkeypatch):
    """Said before any work (the config is not read yet: the embedded data would be written next), both trackers'
    extras in the one line where both are missing."""
    from backbones.dense.train import build_parser, prepare
    config, _ = tiny_ade
    monkeypatch.setitem(sys.modules, 'mlflow', None)  # import mlflow fails as where it is not installed
    needs_mlflow = r"--log-mlflow needs mlflow, which does not import here \(.*\): pip install '\.\[mlflow\]'"
    with pytest.raises(UsageError, match=needs_mlflow):
        prepare(build_parser().parse_args([str(config), '--work-dir', str(tmp_path / 'w'), '--log-mlflow']))
    monkeypatch.setitem(sys.modules, 'wandb', None)
    with pytest.raises(UsageError, match=r"^--log-wandb needs wandb, .*\]'; " + needs_mlflow + '$') as raised:
        prepare(build_parser().parse_args([str(tmp_path / 'absent.py'), '--log-wandb', '--log-mlflow']))
    assert '\n' not in str(raised.value) and not (tmp_path / 'w').exists()


def test_a_tracker_that_cannot_start_is_one_line_and_leaves_no_work_dir(tiny_ade, tmp_path, wandb_without_login):
    """wandb online without a login: the run is refused with one line naming --log-wandb when the runner is built
    (it raised wandb's own error, a traceback), and nothing mmengine wrote before it stays: no work dir, where the
    run made it; in a work dir there before, what was there alone."""
    from backbones.dense.train import build_parser, prepare, train
    config, _ = tiny_ade

    def refused(work: Path) -> None:
        # a visualizer of its own: mmengine hands a process's next runner the one of that name it built before
        run = prepare(build_parser().parse_args([str(config), '--work-dir', str(work), '--iters', '2', '--log-wandb',
                                                 '--pictures', '0', '--cfg-options', f'visualizer.name={work}']))
        with pytest.raises(TrackerError, match=r'^--log-wandb: wandb could not start its run \(wandb login, or '
                                               r'WANDB_MODE=offline\): UsageError: No API key'):
            train(run)

    refused(tmp_path / 'new' / 'work')
    assert not (tmp_path / 'new').exists()
    (tmp_path / 'there').mkdir()
    (tmp_path / 'there' / 'notes.txt').write_text('kept')
    refused(tmp_path / 'there')
    assert [path.name for path in (tmp_path / 'there').iterdir()] == ['notes.txt']


def test_an_evaluator_tta_or_folder_test_seg_cannot_use_is_one_line(tiny_ade, tmp_path):
    """A metric no registry holds, two IoU metrics, a mean IoUMetric does not compute, --tta without the config's
    multi-scale settings, and predictions written where the test set's annotations are (they would replace them)."""
    config, checkpoint = tiny_ade
    refused = {"test_evaluator.type: 'NoSuchMetric' is nothing mmseg, mmengine or the suite registers; the nearest is "
               "'IoUMetric'": ['test_evaluator.type=NoSuchMetric'],  # checked with the options, before the test
               'asks for mBogus: IoUMetric computes': ['test_evaluator.iou_metrics=[mIoU,mBogus]'],
               "tests with the config's tta_pipeline, which it does not set": ['tta_pipeline=None']}
    for says, options in refused.items():
        with pytest.raises(UsageError, match=says):
            prepared_test(config, checkpoint, '--cfg-options', *options, *(['--tta'] if 'tta' in says else []))
    annotations = next(Path(config).parent.glob('ade/annotations/validation'))
    for option in ('--pred-dir', '--show-dir'):
        with pytest.raises(UsageError, match=f"{option} .*validation holds the test set's images or annotations"):
            prepared_test(config, checkpoint, option, str(annotations))
