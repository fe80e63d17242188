"""Bad input named in one line, never a silent wrong result: command-line values, class folders, checkpoints
whose classes differ from the data, damaged images, resumes that would change the run, and the tools' output."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image

from backbones.common.cli import parse_model_kwargs
from backbones.common.commands import run_command
from backbones.common.devices import resolve_device
from backbones.common.distributed import DistInfo
from backbones.common.errors import CheckpointError, DataError, UsageError
from backbones.common.images import ImageReadError, find_classes, read_image
from classification import loaders, train, transfer
from classification.data.folders import ImageFolderDataset
from classification.engine.checkpoints import METRICS
from classification.evaluate import class_order, load_split
from classification.models import build_eval_model, create_classifier
from classification.token_labeling.annotate import generate_token_labels
from helpers.cifar_data import tiny_cifar
from helpers.cls_data import CLASSES, make_image_folder
from helpers.commands import run_tool
from helpers.models import TINY_DEIT


def train_args(data: Path, output: Path, *extra: str) -> list:
    return [*TINY_DEIT, '--data-dir', str(data), '--no-token-labeling', '--img-size', '32', '--batch-size', '4',
            '--epochs', '1', '--warmup-epochs', '0', '--workers', '0', '--device', 'cpu', '--ema-decay', '0',
            '--output', str(output), *extra]


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    """An image folder and a one-epoch run on it (its last.pth records the three class names)."""
    tmp = tmp_path_factory.mktemp('checks')
    data = make_image_folder(tmp / 'data')
    train.main(train_args(data, tmp / 'run'))
    return data, tmp / 'run'


@pytest.mark.parametrize('flag, value, meaning', [
    ('--epochs', '0', '>= 1'), ('--batch-size', '0', '>= 1'), ('--img-size', '0', '>= 1'),
    ('--workers', '-1', '>= 0'), ('--drop-path', '1.5', '[0, 1)'), ('--smoothing', '2', '[0, 1)'),
    ('--hflip', '1.2', '[0, 1]'), ('--scale-min', '0', '(0, 1]'), ('--opt', 'adamz', 'unknown optimizer'),
    ('--interpolation', 'cubic', 'invalid choice'), ('--auto-augment', 'rand-x9', 'RandAugment string'),
    ('--auto-augment', 'rand-zz', 'RandAugment string'), ('--grad-accum-steps', '0', '>= 1'),
    ('--checkpoint-minutes', '-3', '> 0'),
    ('--device', 'gpu', 'invalid choice'), ('--lr-base', '-1', '> 0'),
])
def test_train_cls_values_are_checked_against_their_meaning(flag, value, meaning, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train.build_parser().parse_args(['lvvit_s', flag, value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert flag in err and meaning in err


def test_relabel_without_a_store_suggests_what_works(trained, tmp_path):
    """--token-target label and --no-token-labeling leave ReLabel's label pooling reading the maps: not suggested."""
    data, _ = trained
    with pytest.raises(UsageError, match=r"pass --token-label-dir \(.*\), or another --preset \(label pooling"):
        train.main(train_args(data, tmp_path / 'a', '--preset', 'relabel'))
    with pytest.raises(UsageError, match='or --token-target label or --no-token-labeling'):
        train.main(['lvvit_t', '--data-dir', str(data), '--output', str(tmp_path / 'b'), '--device', 'cpu'])


def test_gpu_decoding_needs_the_batched_path_and_a_gpu(trained, tmp_path):
    data, _ = trained
    for augment in ('pil', 'batched'):  # on a CPU the GPU is what is missing, whatever --augment says
        with pytest.raises(UsageError, match='--decode gpu needs a GPU; this run is on cpu'):
            train.main(train_args(data, tmp_path / augment, '--decode', 'gpu', '--augment', augment))
        assert not (tmp_path / augment).exists()
    with pytest.raises(UsageError, match=r'--decode gpu decodes for the batched augmentation: give --augment batched'):
        loaders.check_decode('gpu', 'pil', torch.device('cuda'))


def test_a_subset_that_leaves_a_class_without_an_image_is_said(trained, caplog):
    data, _ = trained
    ImageFolderDataset(data, 'train', transform=None, max_images=2)  # three classes
    assert f"{data / 'train'}: 2 images kept leave 1 of 3 classes without an image (n003)" in caplog.text
    sizes = [len(list(folder.iterdir())) for folder in (data / 'train').iterdir()]
    enough = -(-sum(sizes) // min(sizes))  # the spacing of the even spread at most the smallest class
    assert f'the smallest class has {min(sizes)} images, so keep at least {enough} images' in caplog.text
    caplog.clear()
    ImageFolderDataset(data, 'train', transform=None, max_images=enough)
    assert 'without an image' not in caplog.text
    caplog.clear()
    ImageFolderDataset(data, 'train', transform=None, max_images=6)
    assert 'without an image' not in caplog.text


@pytest.mark.parametrize('tool_name, args, message', [
    ('transfer_cifar.py', ['lvvit_s', '--dataset', 'cifar10', '--data-dir', '.', '--val-fraction', '1'], '(0, 1)'),
    ('transfer_cifar.py', ['lvvit_s', '--dataset', 'cifar10', '--data-dir', '.', '--opt', 'lamb'], 'invalid choice'),
    ('transfer_cifar.py', ['lvvit_s', '--dataset', 'cifar10', '--data-dir', '.', '--opt', 'nonsense'],
     "invalid choice: 'nonsense' (choose from 'sgd', 'adamw')"),  # its own two, not timm's hundred
    ('generate_token_labels.py', ['--data-dir', '.', '--annotator', 'x', '--output', 'o', '--topk', '0'], '>= 1'),
    ('generate_token_labels.py', ['--data-dir', '.', '--annotator', 'x', '--output', 'o', '--shard-size', '0'],
     '>= 1'),
    ('generate_token_labels.py', ['--data-dir', '.', '--annotator', 'x', '--output', 'o', '--amp', 'fp16'],
     'invalid choice'),
    ('eval_cls.py', ['lvvit_s', '--checkpoint', 'c', '--data-dir', '.', '--crop-pct', '-0.5'], '(0, 1]'),
    ('train_seg.py', ['seg_configs/upernet_lvvit_s.py', '--iters', '0'], '>= 1'),
    ('train_seg.py', ['seg_configs/upernet_lvvit_s.py', '--grad-accum-steps', '0'], '>= 1'),
    ('train_seg.py', ['seg_configs/upernet_lvvit_s.py', '--checkpoint-minutes', '0'], '> 0'),
    ('export.py', ['segmentor', 'seg_configs/upernet_lvvit_s.py', 'c.pth', '--out', 'o', '--size', '0', '64'], '>= 1'),
    ('export.py', ['classifier', 'lvvit_s', '--checkpoint', 'c', '--out', 'o', '--img-size', '-3'], '>= 1'),
    ('export.py', ['detector', 'x'], 'invalid choice'),
    ('import_token_labels.py', ['--data-dir', '.', '--release-dir', '.', '--output', 'o', '--format', 'nfnet'],
     'invalid choice'),
    ('import_token_labels.py', ['--data-dir', '.', '--release-dir', '.', '--output', 'o', '--shard-size', '0'],
     '>= 1'),
])
@pytest.mark.slow
def test_other_tools_check_their_values_in_one_line(tool_name, args, message):
    result = run_tool(tool_name, args)
    assert result.returncode == 2
    assert message in result.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_suite_errors_are_one_line_and_debug_shows_the_traceback(tmp_path):
    result = run_tool('eval_cls.py', ['lvvit_s', '--checkpoint', str(tmp_path / 'absent.pth'), '--data-dir', '.'])
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        'error: no image folder at val (expected the ImageNet layout val/CLASS/*.JPEG)  (--debug shows the '
        'traceback)']
    debug = run_tool('eval_cls.py', ['lvvit_s', '--checkpoint', 'absent.pth', '--data-dir', '.', '--debug'])
    assert debug.returncode == 1 and 'Traceback' in debug.stderr and 'DataError' in debug.stderr


def test_an_error_quoting_an_inner_commands_hint_gives_it_once(capsys, monkeypatch):
    # run_command's log handler would write to this test's captured stdout for every later test: left out
    monkeypatch.setattr('backbones.common.commands.show_log', lambda: None)

    def failing_stage():
        raise DataError('stage failed; the end of its log:\nerror: bad file  (--debug shows the traceback)')

    with pytest.raises(SystemExit) as stopped:
        run_command(failing_stage)
    assert stopped.value.code == 2 and capsys.readouterr().err.count('--debug shows the traceback') == 1


def test_ctrl_c_is_one_interrupted_line_with_the_shells_status(capsys, monkeypatch):
    monkeypatch.setattr('backbones.common.commands.show_log', lambda: None)

    def pressed_ctrl_c():
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as stopped:
        run_command(pressed_ctrl_c)
    assert stopped.value.code == 130
    assert capsys.readouterr().err.splitlines() == [
        "interrupted: SIGINT (Ctrl-C) before the command's work was done (nothing half-written is left): run the "
        'same command again']


def test_ctrl_c_in_a_run_with_a_checkpoint_says_resume(capsys, monkeypatch, tmp_path):
    """Once a training run has written a checkpoint, the same command alone is refused (the run is there): Ctrl-C
    says that --resume continues it; before the first checkpoint the plain line stands."""
    from backbones.common.lifecycle import resumable_on_ctrl_c
    monkeypatch.setattr('backbones.common.commands.show_log', lambda: None)
    checkpoint = tmp_path / 'last.pth'

    def training():
        with resumable_on_ctrl_c(lambda: checkpoint if checkpoint.is_file() else None):
            raise KeyboardInterrupt

    for saved in (False, True):
        if saved:
            checkpoint.write_bytes(b'')
        with pytest.raises(SystemExit) as stopped:
            run_command(training)
        assert stopped.value.code == 130
        said = capsys.readouterr().err.splitlines()
        assert len(said) == 1 and ('--resume' in said[0]) == saved and (str(checkpoint) in said[0]) == saved


def test_class_folders_are_the_visible_non_empty_ones(tmp_path):
    data = make_image_folder(tmp_path / 'data')
    (data / 'train' / '.ipynb_checkpoints').mkdir()
    (data / 'train' / 'n000_empty').mkdir()
    Image.new('RGB', (8, 8)).save(data / 'train' / '.ipynb_checkpoints' / 'x.png')
    assert find_classes(data / 'train') == list(CLASSES)


def test_evaluation_labels_images_by_the_checkpoints_class_names(trained, tmp_path):
    data, run = trained
    partial = Path(shutil.copytree(data, tmp_path / 'partial'))
    shutil.rmtree(partial / 'val' / 'n001')  # one class without validation images
    dataset, order = load_split(str(partial), 'val', str(run / 'last.pth'), transform=lambda x: x)
    assert order == 'the class names the checkpoint records (3)'
    assert dataset.classes == list(CLASSES)
    assert set(dataset.labels.tolist()) == {1, 2}  # n002 and n003 keep their checkpoint indices
    (partial / 'val' / 'n004').mkdir()
    shutil.copy(next((data / 'val' / 'n001').iterdir()), partial / 'val' / 'n004')
    with pytest.raises(DataError, match=r'class folder\(s\) that the checkpoint .* does not: n004'):
        load_split(str(partial), 'val', str(run / 'last.pth'), transform=lambda x: x)


def test_a_bare_state_dict_run_at_another_size_than_its_position_table_says_so(tmp_path, caplog):
    """A file that records no input size: its position table, resized to the size asked for, is named in a warning
    (its model then runs at a size it was not trained at); at its own size, nothing is said."""
    kwargs = dict(embed_dim=32, depth=2, num_heads=2)
    model = timm.create_model('deit_small_patch16_224', num_classes=3, img_size=32, **kwargs)
    torch.save(model.state_dict(), tmp_path / 'small.pth')
    with caplog.at_level('WARNING', logger='vit_dense'):
        build_eval_model('deit_small_patch16_224', str(tmp_path / 'small.pth'), 3, 32, False, kwargs)
        assert 'position table' not in caplog.text
        build_eval_model('deit_small_patch16_224', str(tmp_path / 'small.pth'), 3, 64, False, kwargs)
    assert f'{tmp_path / "small.pth"} holds a position table for another input size than 64 px' in caplog.text


def test_evaluating_a_checkpoint_for_another_class_count_is_an_error(tmp_path):
    model = timm.create_model('deit_small_patch16_224', num_classes=5, img_size=32, embed_dim=32, depth=2,
                              num_heads=2)
    torch.save(model.state_dict(), tmp_path / 'five.pth')  # an official-style file: no class list
    with pytest.raises(CheckpointError, match='head.weight has 5 classes, the model 3'):
        build_eval_model('deit_small_patch16_224', str(tmp_path / 'five.pth'), 3, 32, False,
                         dict(embed_dim=32, depth=2, num_heads=2))


def test_finetuning_on_other_classes_needs_a_new_head(trained, tmp_path):
    data, run = trained
    other = other_classes_same_count(data, tmp_path / 'other')
    with pytest.raises(DataError, match='only in the checkpoint .*: n003; only in the training split: n009'):
        train.main(train_args(other, tmp_path / 'a', '--finetune', str(run / 'last.pth')))
    metrics = train.main(train_args(other, tmp_path / 'b', '--finetune', str(run / 'last.pth'), '--new-head'))
    assert metrics['epochs'] == 1
    with pytest.raises(UsageError, match='--new-head goes with --finetune'):
        train.main(train_args(other, tmp_path / 'c', '--new-head'))


def test_finetuning_runs_at_the_size_its_weights_were_trained_at(trained, tmp_path):
    """Without --img-size a fine-tuning takes the size its --finetune checkpoint records (32 px), not the model's
    own 224."""
    data, run = trained
    args = train_args(data, tmp_path / 'a', '--finetune', str(run / 'last.pth'))
    at = args.index('--img-size')
    train.main(args[:at] + args[at + 2:])
    assert torch.load(tmp_path / 'a' / 'last.pth', weights_only=True)['args']['img_size'] == 32


def other_classes_same_count(data: Path, copy: Path) -> Path:
    """A copy of the image folder with class n003 renamed n009: as many classes, one of them another."""
    other = Path(shutil.copytree(data, copy))
    for split in ('train', 'val'):
        (other / split / 'n003').rename(other / split / 'n009')
    return other


@pytest.mark.parametrize('student', [
    [*TINY_DEIT, '--no-token-labeling'],  # hard distillation
    ['lvvit_t', '--model-kwargs', 'depth=1'],  # with token labeling: online token labeling, the teacher annotates
])
def test_a_teacher_or_annotator_trained_on_other_classes_of_the_same_count_is_refused(trained, tmp_path, student):
    """Its scores for n003 would become targets for n009; the checkpoint records its class names."""
    data, run = trained
    other = other_classes_same_count(data, tmp_path / 'other')
    teacher = ['--teacher', 'deit_small_patch16_224', '--teacher-checkpoint', str(run / 'last.pth'),
               '--teacher-kwargs', 'embed_dim=32', 'depth=2', 'num_heads=2']
    args = [*student, '--data-dir', str(other), '--img-size', '32', '--batch-size', '4', '--epochs', '1',
            '--workers', '0', '--device', 'cpu', '--output', str(tmp_path / 'run'), *teacher]
    with pytest.raises(DataError, match='only in the checkpoint .*: n003; only in the training split: n009'):
        train.main(args)
    assert not (tmp_path / 'run' / 'last.pth').exists()


def test_label_generation_refuses_an_annotator_trained_on_other_classes(trained, tmp_path):
    data, run = trained
    other = other_classes_same_count(data, tmp_path / 'other')
    with pytest.raises(DataError, match=f'only in the checkpoint .*: n003; only in {other / "train"}: n009'):
        generate_token_labels(other, 'deit_small_patch16_224', tmp_path / 'labels', DistInfo(),
                              checkpoint=str(run / 'last.pth'), img_size=32,
                              model_kwargs=dict(embed_dim=32, depth=2, num_heads=2))
    assert not (tmp_path / 'labels').exists()  # nothing started


def test_resume_refuses_other_settings_and_files_that_are_not_runs(trained, tmp_path):
    data, run = trained
    copy = Path(shutil.copytree(run, tmp_path / 'run'))
    (copy / METRICS).unlink()  # as a run stopped after its last checkpoint: a finished one is not resumed
    with pytest.raises(UsageError, match=r'started with epochs=1.*this command gives epochs=3'):
        train.main(train_args(data, copy, '--resume') + ['--epochs', '3'])
    with pytest.raises(UsageError, match=r'lr_base=0\.0005.*lr_base=0\.002'):
        train.main(train_args(data, copy, '--resume', '--lr-base', '2e-3'))
    weights_only = tmp_path / 'weights.pth'
    torch.save({'state_dict': torch.load(run / 'last.pth', weights_only=True)['state_dict']}, weights_only)
    with pytest.raises(CheckpointError, match="not a training checkpoint .* no 'optimizer'"):
        train.main(train_args(data, tmp_path / 'x', '--resume', str(weights_only)))


@pytest.mark.slow
def test_a_file_as_output_and_a_json_into_a_missing_folder_are_refused(trained, tmp_path):
    data, run = trained
    (tmp_path / 'file').write_text('x')
    with pytest.raises(UsageError, match='is a file'):
        train.main(train_args(data, tmp_path / 'file' / 'run'))
    result = run_tool('eval_cls.py', [*TINY_DEIT, '--checkpoint', str(run / 'last.pth'), '--data-dir', str(data),
                                         '--json', str(tmp_path / 'missing' / 'e.json')])
    assert result.returncode == 2 and 'the folder' in result.stderr and 'does not exist' in result.stderr


def test_model_arguments_and_sizes_that_do_not_fit_are_named(trained, tmp_path):
    data, _ = trained
    with pytest.raises(UsageError, match='does not take these arguments'):
        train.main(train_args(data, tmp_path / 'a', '--model-kwargs', 'depht=2'))
    with pytest.raises(UsageError, match="--model-kwargs takes key=value, got 'depth'"):
        parse_model_kwargs(['depth'])
    with pytest.raises(UsageError, match='--img-size 8 is smaller than one patch'):
        create_classifier('lvvit_s', 3, 8, depth=1)
    with pytest.raises(UsageError, match='multiple of its 16 px patches'):
        create_classifier('cait_xxs24_224', 3, 40, depth=1)


def test_a_gpu_that_is_not_there_is_an_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    with pytest.raises(UsageError, match='--device cuda: no GPU'):
        resolve_device('cuda')
    assert resolve_device(None) is False and resolve_device('cpu') is False


def test_cooldown_epochs_are_announced(trained, tmp_path, caplog):
    data, _ = trained
    with caplog.at_level('INFO', logger='vit_dense'):
        metrics = train.main(train_args(data, tmp_path / 'a', '--cooldown-epochs', '1'))
    assert metrics['epochs'] == 2
    assert '1 epochs + 1 cooldown epochs at the final lr = 2 epochs' in caplog.text


def test_truncated_16_bit_and_palette_images(tmp_path):
    rgb = (np.random.default_rng(0).random((40, 50, 3)) * 255).astype(np.uint8)
    Image.fromarray(rgb).save(tmp_path / 'a.jpg')
    data = (tmp_path / 'a.jpg').read_bytes()
    (tmp_path / 'cut.jpg').write_bytes(data[:len(data) // 2])
    with pytest.raises(ImageReadError, match='cut.jpg'):
        read_image(tmp_path / 'cut.jpg')
    grey = np.linspace(0, 65535, 2000).reshape(40, 50).astype(np.uint16)
    Image.fromarray(grey).save(tmp_path / 'g16.png')
    decoded = np.asarray(read_image(tmp_path / 'g16.png')).astype(float)
    np.testing.assert_allclose(decoded[..., 0], grey / 257, atol=0.51)
    palette = Image.fromarray((np.arange(12).reshape(3, 4) % 3).astype(np.uint8), 'P')
    palette.putpalette([255, 0, 0, 0, 255, 0, 10, 20, 30] + [0] * 759)
    palette.save(tmp_path / 'p.png')
    assert np.asarray(read_image(tmp_path / 'p.png'))[0].tolist() == [[255, 0, 0], [0, 255, 0], [10, 20, 30],
                                                                      [255, 0, 0]]


def test_training_on_unreadable_images_only_is_an_error(tmp_path):
    data = make_image_folder(tmp_path / 'data')
    for path in (data / 'train').rglob('*.*'):
        path.write_bytes(b'broken')
    with pytest.raises(DataError, match='trained on no image'):
        train.main(train_args(data, tmp_path / 'run', '--skip-unreadable'))
    assert not (tmp_path / 'run').exists()  # refused before its first checkpoint: nothing of it is left


@pytest.mark.parametrize('augment', ['pil', 'batched'])
def test_an_unreadable_image_a_loader_worker_reads_ends_the_run_with_its_line_not_a_hang(tmp_path, augment):
    """A truncated JPEG read by a loader worker stops the run with one line naming it and status 2, and the process
    ends. Its loader workers ignore SIGTERM (the training process handles the stop signals) and torch's loader kept
    them past the error, so Python's exit, which sends its daemonic children SIGTERM and waits for them, waited
    forever after the line."""
    data = make_image_folder(tmp_path / 'data')
    broken = data / 'train' / CLASSES[1] / f'{CLASSES[1]}_2.JPEG'
    broken.write_bytes(broken.read_bytes()[:200])
    args = train_args(data, tmp_path / 'run', '--augment', augment)
    args[args.index('--workers') + 1] = '2'
    result = run_tool('train_cls.py', args, fresh=True, timeout=240)  # a process of its own: its exit is the test
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith(f'error: cannot read image {broken}')
    assert not (tmp_path / 'run').exists()  # it held args.yaml and a TensorBoard file of the refused run


def test_a_loss_that_is_not_finite_ends_the_run_with_one_line(tmp_path):
    data = make_image_folder(tmp_path / 'data')
    result = run_tool('train_cls.py', train_args(data, tmp_path / 'run', '--lr-base', '1e12'))
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith('error: loss is nan at update ')


def test_token_label_pictures_leave_out_the_unreadable_images_the_run_skips(labeled_images, tmp_path):
    """--skip-unreadable: an unreadable image among those the TensorBoard pictures show is left out of them, as
    training skips it (the pictures stopped the run after each epoch's checkpoint, before its log line)."""
    data, labels = labeled_images
    shutil.copytree(data, tmp_path / 'data')
    first_class = sorted((tmp_path / 'data' / 'train').iterdir())[0]  # the first pictures' images
    for image in first_class.iterdir():
        image.write_bytes(b'broken')
    args = [arg if arg != '--no-token-labeling' else '--token-labeling'
            for arg in train_args(tmp_path / 'data', tmp_path / 'run', '--skip-unreadable', '--pictures', '4',
                                  '--token-label-dir', str(labels))]
    metrics = train.main(args)
    assert metrics['epochs'] == 1 and metrics['skipped_images'] == len(list(first_class.iterdir()))
    assert (tmp_path / 'run' / 'log.jsonl').read_text().count('"epoch"') == 1


def test_skipping_one_unreadable_image_leaves_an_odd_batch_that_mixup_still_mixes(tmp_path):
    """timm's Mixup refuses odd batches; a batch one image short still trains with MixUp/CutMix (standard recipe)."""
    data = make_image_folder(tmp_path / 'data')
    (data / 'train' / CLASSES[0] / f'{CLASSES[0]}_1.JPEG').write_bytes(b'broken')
    train.main(train_args(data, tmp_path / 'run', '--skip-unreadable', '--preset', 'standard'))
    assert json.loads((tmp_path / 'run' / METRICS).read_text())['skipped_images'] == 1


def test_mixup_of_an_odd_batch_pairs_image_i_with_image_b_minus_i():
    """Known answer: with MixUp only, image k of 3 (k > 0) becomes lam x_k + (1 - lam) x_(3-k), image 0 stays itself,
    and each target mixes the same two labels."""
    from timm.data import Mixup

    from classification.objectives.objective import mix_within_batch
    torch.manual_seed(0)
    np.random.seed(0)
    images, labels = torch.randn(3, 3, 4, 4), torch.tensor([0, 1, 2])
    mixup = Mixup(mixup_alpha=1.0, cutmix_alpha=0.0, label_smoothing=0.0, num_classes=3)
    mixed, targets = mix_within_batch(mixup, images.clone(), labels)
    lam = float(targets[1, 1])
    assert mixed.shape == images.shape and 0 < lam < 1
    torch.testing.assert_close(mixed[0], images[0])
    torch.testing.assert_close(mixed[1], lam * images[1] + (1 - lam) * images[2])
    torch.testing.assert_close(mixed[2], lam * images[2] + (1 - lam) * images[1])
    torch.testing.assert_close(targets, torch.tensor([[1, 0, 0], [0, lam, 1 - lam], [0, 1 - lam, lam]]))


def test_a_class_folder_of_images_the_suite_does_not_read_is_named_not_dropped(tmp_path):
    """A class folder holding only GIFs would silently leave the class list one short: it is named instead."""
    data = make_image_folder(tmp_path / 'data')
    gifs = data / 'train' / 'n004'
    gifs.mkdir()
    Image.new('RGB', (40, 40)).save(gifs / 'a.gif')
    with pytest.raises(DataError, match=r'n004 holds no image the suite reads \(its files: \.gif;'):
        train.main(train_args(data, tmp_path / 'run'))
    shutil.rmtree(gifs)
    (data / 'train' / 'n005').mkdir()  # an empty folder is no class and no error
    assert find_classes(data / 'train') == list(CLASSES)


def test_default_loader_workers_fit_the_machine():
    """No more loader processes by default than cores (PyTorch warns beyond them): 4, or fewer on a smaller machine."""
    from classification import evaluate
    for parser, argv in ((train.build_parser(), ['lvvit_s']),
                         (evaluate.build_parser(), ['lvvit_s', '--checkpoint', 'c.pth', '--data-dir', 'd'])):
        assert parser.parse_args(argv).workers == min(4, os.cpu_count())


def test_transfer_records_the_cifar_class_names(tmp_path):
    from classification.data.cifar import read_cifar
    root, _ = tiny_cifar(tmp_path / 'c10', 'cifar10', per_class_train=6, per_class_test=2, archive=True)
    out = tmp_path / 'run'
    transfer.main([*TINY_DEIT, '--dataset', 'cifar10', '--data-dir', str(root), '--output', str(out),
                   '--img-size', '32', '--batch-size', '8', '--workers', '0', '--device', 'cpu', '--epochs', '1'])
    stored = torch.load(out / 'last.pth', weights_only=True)['args']['classes']
    assert stored == read_cifar(root, 'cifar10').classes and len(stored) == 10
    assert json.loads((out / METRICS).read_text())['epochs'] == 1


def test_imagenet_v2_numeric_folders_are_the_class_indices(tmp_path):
    """ImageNet-V2 names its class folders 0 ... 999, each the index of the class in ImageNet's order: folder 10 is
    class 10 (sorted names would make it class 2), for an official checkpoint (no class list) and for one recording
    WordNet ids; the tool says which order it used."""
    for i in range(12):
        (tmp_path / 'v2' / 'val' / str(i)).mkdir(parents=True)
        Image.new('RGB', (32, 32), (20 * i, 0, 0)).save(tmp_path / 'v2' / 'val' / str(i) / 'a.jpeg')
    for recorded in (None, [f'n{i:08d}' for i in range(12)]):
        classes, order = class_order(tmp_path / 'v2', 'val', recorded)
        dataset = ImageFolderDataset(tmp_path / 'v2', 'val', lambda x: x, classes=classes)
        assert all(label == int(path.split('/')[1]) for path, label in map(dataset.sample, range(len(dataset))))
        assert order.startswith('ImageNet-V2 layout: folder i is class i of the model\'s 12 classes')
    assert class_order(tmp_path / 'v2', 'val', [str(i) for i in range(12)])[1] == \
        'the class names the checkpoint records (12)'  # folders the checkpoint names: by name
    model = timm.create_model('deit_small_patch16_224', num_classes=12, img_size=32, embed_dim=32, depth=2,
                              num_heads=2)
    torch.save(model.state_dict(), tmp_path / 'official.pth')
    result = run_tool('eval_cls.py', [*TINY_DEIT, '--checkpoint', str(tmp_path / 'official.pth'), '--data-dir',
                                      str(tmp_path / 'v2'), '--img-size', '32', '--workers', '0', '--json',
                                      str(tmp_path / 'e.json')])
    assert result.returncode == 0, result.stderr
    assert 'class order: ImageNet-V2 layout' in result.stdout
    assert json.loads((tmp_path / 'e.json').read_text())['class_order'].startswith('ImageNet-V2 layout')


def test_resume_refuses_another_precision_or_augmentation_path(trained, tmp_path):
    data, run = trained
    copy = Path(shutil.copytree(run, tmp_path / 'run'))
    (copy / METRICS).unlink()  # as a run stopped after its last checkpoint: a finished one is not resumed
    with pytest.raises(UsageError, match=r"started with amp='none'.*this command gives amp='bf16'"):
        train.main(train_args(data, copy, '--resume', '--amp', 'bf16'))
    with pytest.raises(UsageError, match=r"started with augment='pil'.*this command gives augment='batched'"):
        train.main(train_args(data, copy, '--resume', '--augment', 'batched'))


def test_silent_settings_are_refused_or_said(trained, tmp_path, caplog):
    """--preset vit-finetune without weights to fine-tune is refused; a label store the recipe does not read, and an
    lr below the schedule's floor, are said."""
    data, _ = trained
    with pytest.raises(UsageError, match='--preset vit-finetune fine-tunes pretrained weights: give them with '
                                         '--finetune'):
        train.main(train_args(data, tmp_path / 'a', '--preset', 'vit-finetune', '--img-size', '32'))
    train.main(train_args(data, tmp_path / 'b', '--token-label-dir', str(tmp_path), '--lr-base', '1e-6',
                          '--min-lr', '1e-4'))
    said = caplog.text
    assert f'--token-label-dir {tmp_path} is not used' in said
    assert "is below the schedule's floor (min lr 0.0001)" in said
    # a label store given without the images it labels: the embedded data would train with its own labels instead
    from classification.digits.cls_data import EmbeddedScans
    with pytest.raises(UsageError, match=r'--token-label-dir /x goes with --data-dir \(the images it labels\)'):
        train.main(['lvvit_s', '--token-label-dir', '/x', '--output', str(tmp_path / 'c')], default_data=EmbeddedScans)
    # MixUp and CutMix do nothing under token labeling (MixToken mixes): said, and not shown as the recipe's
    caplog.clear()
    caplog.set_level('INFO', logger='vit_dense')
    args = train_args(data, tmp_path / 'd', '--mixup', '0.5', '--cutmix', '0.5')
    train.main([a for a in args if a != '--no-token-labeling'] + ['--token-labeling', '--token-target', 'label'])
    said = caplog.text
    assert 'warning: --mixup and --cutmix not used: token labeling mixes images with MixToken (--mix-token)' in said
    recipe = json.loads(next(line for line in said.splitlines() if 'recipe: ' in line).split('recipe: ', 1)[1])
    assert recipe['token_labeling'] and 'mixup' not in recipe and 'cutmix' not in recipe


@pytest.mark.parametrize('tool_name, args, message', [
    ('benchmark_loop.py', ['--device', 'cuda'], '--device cuda: no GPU is visible'),
    ('benchmark_loop.py', ['--device', 'cpu', '--amp', 'fp16'], '--amp fp16 needs a GPU'),
    ('benchmark_loop.py', ['--device', 'cpu', '--timm-train', 'nowhere/train.py'], 'nowhere/train.py: no such file'),
    ('benchmark_loop.py', ['--device', 'cpu', '--timm-train', 'tools/eval_cls.py'],
     "--timm-train tools/eval_cls.py: not timm's train.py (it takes no --aa, --cutmix,"),
    ('benchmark_loop.py', ['--device', 'cpu', '--models', 'lvvit_s', '--timm-train', 'tools/eval_cls.py'],
     "--timm-train: timm's train.py runs the models without token labeling, and --models gives only token-labeling"),
    ('benchmark_loop.py', ['--device', 'cpu', '--decode', 'gpu'], '--decode gpu needs a GPU'),
    ('reproduce_token_labeling.py', ['--out', 'README.md'], 'cannot use README.md as output folder'),
])
@pytest.mark.slow
def test_tools_refuse_a_device_precision_or_output_they_cannot_use(tool_name, args, message):
    if 'cuda' in args and torch.cuda.is_available():
        pytest.skip('a GPU is here')
    result = run_tool(tool_name, args)
    assert result.returncode == 2 and message in result.stderr and 'Traceback' not in result.stderr


def test_real_labels_on_a_folder_that_is_not_imagenets_validation_set(trained, tmp_path):
    data, run = trained
    result = run_tool('eval_cls.py', [*TINY_DEIT, '--checkpoint', run / 'last.pth', '--data-dir', data, '--img-size',
                                      '32', '--workers', '0', '--real-labels'])
    assert result.returncode == 2 and 'Traceback' not in result.stderr
    assert "the ReaL labels are for ImageNet's 50,000 validation images" in result.stderr
    assert 'this split has 12 image(s), e.g. n001_0.png' in result.stderr


@pytest.mark.parametrize('option', ['--digits-dir', '--digits-seg-dir'])
def test_an_embedded_data_folder_that_is_a_file_is_refused_by_name(option, tmp_path, capsys):
    """The embedded data's folders are written into: a file there (or above) is an argparse error naming the option,
    before any work, not a traceback from the first mkdir."""
    from backbones.dense.train import build_parser as seg_parser
    from classification.digits.cls_data import EmbeddedScans
    from classification.digits.seg_data import EmbeddedPages
    taken = tmp_path / 'taken'
    taken.write_text('')
    if option == '--digits-dir':
        parser, argv = train.build_parser(EmbeddedScans), ['lvvit_s']
    else:
        parser, argv = seg_parser(), ['config.py']
        EmbeddedPages.add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args([*argv, option, str(taken / 'below')])
    assert f'argument {option}: cannot use {taken / "below"} as output folder: {taken} is a file' in \
        capsys.readouterr().err
    assert parser.parse_args([*argv, option, str(tmp_path / 'new')]).__dict__[option[2:].replace('-', '_')] == \
        tmp_path / 'new'


def test_ctrl_c_in_train_seg_is_the_suites_line_alone(capsys, monkeypatch, tmp_path):
    """Before its first checkpoint, mmengine's find_latest_checkpoint printed 'Did not find last_checkpoint to be
    resumed.' above the suite's line; after it, the line names the checkpoint and --resume."""
    from backbones.dense.runner import SuiteRunner  # first: it lets mmseg import on mmcv-lite

    # isort: split
    from mmengine.runner import Runner
    monkeypatch.setattr('backbones.common.commands.show_log', lambda: None)

    def pressed_ctrl_c(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(Runner, 'train', pressed_ctrl_c)
    runner = SuiteRunner.__new__(SuiteRunner)  # the training loop alone: what surrounds it is mmengine's
    runner._work_dir, runner._running = str(tmp_path), lambda action: action()
    for saved in (False, True):
        if saved:
            (tmp_path / 'last_checkpoint').write_text(str(tmp_path / 'iter_8.pth'))
        with pytest.raises(SystemExit) as stopped:
            run_command(runner.train)
        captured = capsys.readouterr()
        said = (captured.out + captured.err).splitlines()
        assert stopped.value.code == 130 and len(said) == 1, said
        assert said[0].startswith('interrupted: SIGINT (Ctrl-C)') and ('iter_8.pth' in said[0]) == saved

