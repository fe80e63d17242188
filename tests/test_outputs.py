"""Outputs that cannot be written: a read-only output folder is named before any work, and a disk that fills up is
a one-line error that leaves no temporary or half-made file. Each command runs on a tmpfs of its own (read-only, or a
few kilobytes), mounted in namespaces of the command's own."""
from __future__ import annotations

import pytest
import timm
import torch

from helpers.cls_data import make_image_folder
from helpers.commands import one_line_error, run_tool, run_tool_on_tmpfs
from helpers.models import TINY_DEIT
from helpers.seg_data import write_tiny_ade, write_tiny_config

pytestmark = pytest.mark.slow  # tools run end to end here: make test-fast leaves this file out


@pytest.fixture(scope='module')
def inputs(tmp_path_factory):
    """An image folder, a resnet10t checkpoint for its 3 classes, and a tiny ADE20K set with its UperNet config."""
    tmp = tmp_path_factory.mktemp('inputs')
    data = make_image_folder(tmp / 'data')
    torch.manual_seed(0)
    torch.save(timm.create_model('resnet10t', num_classes=3).state_dict(), tmp / 'resnet.pth')
    config = write_tiny_config(tmp / 'tiny_upernet.py', 'upernet_lvvit_s.py', write_tiny_ade(tmp / 'ade'))
    return tmp, data, config


def train_cls_args(data, output) -> list:
    return [*TINY_DEIT, '--data-dir', data, '--no-token-labeling', '--img-size', '32', '--batch-size', '4',
            '--epochs', '1', '--workers', '0', '--device', 'cpu', '--output', output]


def generate_args(tmp, data, output, img_size: int = 64) -> list:
    return ['--data-dir', data, '--annotator', 'resnet10t', '--checkpoint', tmp / 'resnet.pth', '--output', output,
            '--img-size', img_size, '--workers', '0']


@pytest.mark.parametrize('command', ['train_cls', 'generate', 'eval_cls', 'attention_json', 'train_seg', 'test_seg',
                                     'benchmark_seg'])
def test_a_read_only_output_is_named_before_any_work(command, inputs, tmp_path):
    tmp, data, config = inputs
    ro = tmp_path / 'ro'
    image = sorted((data / 'val' / 'n001').iterdir())[0]
    tool, args, target = {
        'train_cls': ('train_cls.py', train_cls_args(data, ro / 'run'), ro / 'run'),
        'generate': ('generate_token_labels.py', generate_args(tmp, data, ro / 'store'), ro / 'store'),
        'eval_cls': ('eval_cls.py', ['resnet10t', '--checkpoint', tmp / 'resnet.pth', '--data-dir', data,
                                     '--workers', '0', '--json', ro / 'e.json'], ro / 'e.json'),
        'attention_json': ('visualize.py', ['attention', *TINY_DEIT, '--image', image, '--out', tmp_path / 'a.png',
                                            '--json', ro / 'a.json'], ro / 'a.json'),
        'train_seg': ('train_seg.py', [config, '--work-dir', ro / 'work', '--iters', '1'], ro / 'work'),
        'test_seg': ('test_seg.py', [config, tmp / 'resnet.pth', '--out', ro / 'r.json'], ro / 'r.json'),
        'benchmark_seg': ('benchmark_seg.py', ['--json', ro / 'b.json'], ro / 'b.json'),
    }[command]
    result, left = run_tool_on_tmpfs(tool, args, ro, read_only=True)
    error = one_line_error(result)
    assert f'cannot write {target}' in error and f'{ro} is on a read-only file system' in error, error
    assert not (tmp_path / 'a.png').exists() and not left  # stopped before the work


def test_a_full_disk_stops_training_without_a_torn_or_temporary_checkpoint(inputs, tmp_path):
    _, data, _ = inputs
    mount = tmp_path / 'small'
    result, left = run_tool_on_tmpfs('train_cls.py', train_cls_args(data, mount / 'run'), mount, size_kb=64)
    error = one_line_error(result)
    assert f"No space left on device: '{mount / 'run' / 'last.pth'}'" in error and '--resume' in error, error
    assert 'run/last.pth' not in left and not [name for name in left if '.tmp' in name], left


def test_a_disk_too_small_for_the_label_store_is_an_error_before_generation(inputs, tmp_path):
    """The store's arrays take their whole size when made: without that, memory-mapped rows written into a full
    tmpfs kill the process (SIGBUS) part of the way through."""
    tmp, data, _ = inputs
    mount = tmp_path / 'small'
    result, left = run_tool_on_tmpfs('generate_token_labels.py', generate_args(tmp, data, mount / 'store', 256),
                                     mount, size_kb=16)
    error = one_line_error(result)
    assert 'No space left on device' in error and '.npy' in error, error
    assert not [name for name in left if name.endswith('.npy') or '.tmp' in name], left


def test_a_full_disk_stops_segmentation_training_without_a_torn_checkpoint(inputs, tmp_path):
    _, _, config = inputs
    mount = tmp_path / 'small'
    result, left = run_tool_on_tmpfs('train_seg.py', [config, '--work-dir', mount / 'work', '--iters', '1'], mount,
                                     size_kb=256)
    error = one_line_error(result)
    assert 'No space left on device' in error and 'iter_1.pth' in error, error
    assert not [name for name in left if name.endswith('.pth') or '.tmp' in name], left


def test_a_folder_that_takes_no_new_file_is_named_before_any_work(tmp_path):
    """/proc passes access(2) for root, yet takes no new file: test_seg ran the whole test, then failed writing --out
    with a traceback. The check makes a file there; a trailing slash names a folder, not a file to write."""
    from backbones.common.errors import UsageError
    from backbones.common.outputs import check_writable
    with pytest.raises(UsageError, match='cannot write /proc/scores.json'):
        check_writable('/proc/scores.json')
    check_writable(str(tmp_path / 'scores.json'))
    assert list(tmp_path.iterdir()) == []  # the check's own file is gone
    with pytest.raises(UsageError, match='names a folder'):
        check_writable(f'{tmp_path / "scores"}/')


@pytest.mark.parametrize('name', ['attention.txt', 'attention', 'attention.jpg2'])
def test_a_picture_not_named_png_is_refused_before_any_work(name, tmp_path):
    """visualize writes PNG: another suffix failed only once the picture was drawn."""
    result = run_tool('visualize.py', ['attention', *TINY_DEIT, '--out', tmp_path / name])
    assert result.returncode == 2
    assert f'{tmp_path / name}: give a .png file' in one_line_error(result)
    assert not (tmp_path / name).exists()
