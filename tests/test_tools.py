"""Command-line tools, run as a user runs them: from the repository root, no PYTHONPATH."""
from __future__ import annotations

import json

import pytest
import timm

from helpers.commands import run_tool


def vit_macs(depth: int, dim: int, mlp: int, tokens: int, patches: int, classes: int) -> int:
    """Independent count for a ViT: patch conv, per block qkv + two attention products + proj + MLP, head."""
    block = tokens * dim * 3 * dim + 2 * tokens * tokens * dim + tokens * dim * dim + 2 * tokens * dim * mlp
    return patches * dim * 3 * 16 * 16 + depth * block + dim * classes


def test_model_info_json_matches_independent_counts():
    result = run_tool('model_info.py', ['deit_small_patch16_224', '--json'])
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    model = timm.create_model('deit_small_patch16_224')
    assert info['params'] == sum(p.numel() for p in model.parameters()) == info['trainable_params']
    assert info['macs'] == vit_macs(12, 384, 1536, 197, 196, 1000)


def test_model_info_counts_frozen_tables_as_untrained():
    result = run_tool('model_info.py', ['t2t_vit_7', '--img-size', '96', '--json'])
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    frozen = (6 * 6 + 1) * 256 + 2 * 32 * 64  # sinusoid table at 96 and the two performers' random features
    assert info['params'] - info['trainable_params'] == frozen


@pytest.mark.slow
def test_unknown_model_lists_close_names():
    for tool in ('model_info.py', 'benchmark.py'):
        result = run_tool(tool, ['t2t_vit14'])
        assert result.returncode == 2
        assert "unknown model 't2t_vit14'" in result.stderr and 't2t_vit_14' in result.stderr


@pytest.mark.slow
def test_loop_benchmark_names_the_slower_stage(tmp_path):
    """The loop benchmark on synthetic JPEGs: every stage measured, and the bound stage
    the slower of the loop's input pipeline and the model step."""
    result = run_tool('benchmark_loop.py', ['--models', 'deit_tiny_patch16_224', '--batch-size', '4', '--batches', '2',
                                            '--images', '12', '--workers', '1', '--json'])
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    (f,) = figures['models']
    pool = f['pipeline_1_workers_img_s']
    assert f['loop']['augment'] == 'pil'  # auto on a CPU
    slower = 'input pipeline' if pool['pil'] < f['model_step_img_s'] else 'model step'
    assert f['bound'] == slower
    assert 0 < f['loop']['img_s'] <= 1.5 * min(pool['pil'], f['model_step_img_s'])  # not faster than its bound


def test_loop_benchmark_names_a_missing_data_folder(tmp_path):
    missing = tmp_path / 'imagenet'
    result = run_tool('benchmark_loop.py', ['--data-dir', str(missing)])
    assert result.returncode == 2
    assert f'no image folder at {missing / "train"}' in result.stderr and 'Traceback' not in result.stderr


@pytest.mark.slow
def test_token_labeling_benchmark_measures_the_training_step_and_checks_its_builder(tmp_path):
    """The token-labeling benchmark through the training tool's objective (a batch as the loader gives it, whole-image
    maps); its batched target builder agrees with the per-image way, and the store packs 2 + 2 bytes per score."""
    result = run_tool('benchmark_token_labeling.py', [
        '--model', 'lvvit_t', '--batch-size', '2', '--img-size', '64', '--num-classes', '10', '--builder-batch', '8',
        '--store-images', '20', '--steps', '1', '--warmup', '0', '--repeats', '1', '--tmp-dir', tmp_path,
        '--json', tmp_path / 'figures.json'])
    assert result.returncode == 0, result.stderr
    figures = json.loads((tmp_path / 'figures.json').read_text())
    assert figures['train_step']['token_grid'] == [4, 4]  # the model's own grid at 64 px: 16 px patches
    assert figures['target_builder']['max_abs_difference'] < 1e-5
    assert 14 * 14 * 5 * 4 <= figures['label_store']['packed_bytes_per_image'] < 14 * 14 * 5 * 4 + 64
