"""Two nodes: two torchrun launchers (--nnodes 2, rendezvous on localhost, gloo, one process each) give the same
training run and the same label store as one node with two processes."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import timm
import torch

from classification.token_labeling.label_store import TokenLabelStore
from helpers.commands import ENV, ROOT, free_port, run_torchrun
from helpers.models import TINY_DEIT
from helpers.training_runs import assert_same_run

pytestmark = pytest.mark.slow  # tools run end to end here: make test-fast leaves this file out


def run_two_nodes(tool: str, args: list) -> None:
    """`torchrun --nnodes 2 --node-rank R --nproc-per-node 1` for R = 0 and 1 at once, as two machines would."""
    port = free_port()
    launchers = [subprocess.Popen(
        [sys.executable, '-m', 'torch.distributed.run', '--nnodes', '2', '--node-rank', str(rank), '--nproc-per-node',
         '1', '--master-addr', '127.0.0.1', '--master-port', str(port), ROOT / 'tools' / tool, *map(str, args)],
        cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    for launcher in launchers:
        output, _ = launcher.communicate(timeout=600)
        assert launcher.returncode == 0, output[-3000:]


def test_two_nodes_train_like_one_node_with_two_processes(labeled_images, tmp_path):
    data, labels = labeled_images
    args = [*TINY_DEIT, '--data-dir', data, '--token-label-dir', labels, '--token-labeling', '--epochs', '2',
            '--workers', '1', '--img-size', '32', '--batch-size', '2', '--lr-base-batch', '4', '--warmup-epochs',
            '1', '--device', 'cpu', '--ema-decay', '0.9']
    run_torchrun('train_cls.py', [*args, '--output', tmp_path / 'one_node'], processes=2)
    run_two_nodes('train_cls.py', [*args, '--output', tmp_path / 'two_nodes'])
    assert_same_run(tmp_path / 'one_node', tmp_path / 'two_nodes', epochs=2, images=12)


def test_two_nodes_generate_the_store_one_node_does(labeled_images, tmp_path):
    data, _ = labeled_images
    torch.manual_seed(0)
    torch.save(timm.create_model('resnet10t', num_classes=3).state_dict(), tmp_path / 'annotator.pth')
    args = ['--data-dir', data, '--annotator', 'resnet10t', '--checkpoint', tmp_path / 'annotator.pth', '--img-size',
            '64', '--topk', '2', '--workers', '0', '--shard-size', '5', '--device', 'cpu']
    run_torchrun('generate_token_labels.py', [*args, '--output', tmp_path / 'one_node'], processes=2)
    run_two_nodes('generate_token_labels.py', [*args, '--output', tmp_path / 'two_nodes'])
    one, two = TokenLabelStore(tmp_path / 'one_node'), TokenLabelStore(tmp_path / 'two_nodes')
    assert one.paths == two.paths
    for row in range(len(one)):
        for a, b in zip(one.read(row), two.read(row)):
            np.testing.assert_array_equal(a, b)
