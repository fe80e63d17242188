"""Fixtures shared by the test modules (helpers live in the `helpers` package)."""
from __future__ import annotations

import pytest
import timm
import torch

import backbones  # noqa: F401  (registers the models)
from backbones.common.distributed import DistInfo
from classification.token_labeling.annotate import generate_token_labels
from helpers.cls_data import make_image_folder
from helpers.shared import built_once
from helpers.training_runs import tiny_deit_run

# One thread per test process, as the commands the tests run have (helpers.commands.ENV): pytest-xdist runs a worker
# per core, and torch's default of a thread per core in each of them oversubscribes the machine (on 2 cores the
# in-process tests took twice as long).
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope='session')
def labeled_images(tmp_path_factory):
    """A tiny ImageNet-layout folder (3 classes, 8 train and 4 val images each) and its token-label store (a random
    resnet10t annotator, top-2 at 64 px, its weights `annotator.pth` beside them), shared by every worker: read it,
    copy it to change it."""
    def build(tmp):
        data = make_image_folder(tmp / 'data')
        torch.manual_seed(0)
        annotator = timm.create_model('resnet10t', num_classes=3)
        torch.save(annotator.state_dict(), tmp / 'annotator.pth')
        generate_token_labels(data, 'resnet10t', tmp / 'labels', DistInfo(), checkpoint=str(tmp / 'annotator.pth'),
                              img_size=64, topk=2, workers=0)

    tmp = built_once(tmp_path_factory, 'labeled_images', build)
    return tmp / 'data', tmp / 'labels'


@pytest.fixture(scope='session')
def tiny_deit(tmp_path_factory):
    """An image folder of three named classes and a tiny DeiT trained on it for two epochs (its last.pth), shared by
    every worker: read it, copy it to change it."""
    folder = built_once(tmp_path_factory, 'tiny_deit', lambda root: tiny_deit_run(root, epochs=2))
    return folder / 'data', folder / 'run' / 'last.pth'


@pytest.fixture
def wandb_without_login(monkeypatch, tmp_path):
    """wandb online with no login, as on a machine where `wandb login` was never run: no API key in the environment,
    a home (its netrc, wandb's settings) of its own; wandb refuses to start a run without asking the network. Its
    process-wide setup, which keeps the settings of the first run a process starts (another test's offline mode),
    is made anew before and after, as in a command of its own."""
    import wandb
    for name in ('WANDB_API_KEY', 'WANDB_DIR', 'WANDB_CONFIG_DIR', 'NETRC'):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / 'home').mkdir()
    monkeypatch.setenv('HOME', str(tmp_path / 'home'))
    monkeypatch.setenv('WANDB_MODE', 'online')
    monkeypatch.setenv('WANDB_SILENT', 'true')
    wandb.teardown()
    yield
    wandb.teardown()


# The files that take longest (`--durations`, 2 cores), started first: pytest-xdist hands whole files to its workers
# in collection order, and one of these started last leaves the other core idle for minutes at the end of the run.
LONGEST_FIRST = ('test_seg_chain.py', 'test_train_cls.py', 'test_preemption.py', 'test_digits.py', 'test_outputs.py',
                 'test_tools.py', 'test_results_pages.py', 'test_wds_shards.py', 'test_published_layouts.py',
                 'test_transfer_sets.py')


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)
    items.sort(key=rank)  # stable: the other files, and each file's tests, keep their order
