"""Fixtures shared by the test modules (helpers live in the `helpers` package)."""
from __future__ import annotations


import pytest
import timm
import torch

import backbones  # noqa: F401  (registers the models)
from backbones.common.distributed import DistInfo
from helpers.cls_data import make_image_folder
from classification.token_labeling.annotate import generate_token_labels


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope='session')
def labeled_images(tmp_path_factory):
    """A tiny ImageNet-layout folder (3 classes, 8 train and 4 val images each) and its token-label store (a random
    resnet10t annotator, top-2 at 64 px)."""
    tmp = tmp_path_factory.mktemp('labeled_images')
    data = make_image_folder(tmp / 'data')
    torch.manual_seed(0)
    annotator = timm.create_model('resnet10t', num_classes=3)
    torch.save(annotator.state_dict(), tmp / 'annotator.pth')
    generate_token_labels(data, 'resnet10t', tmp / 'labels', DistInfo(), checkpoint=str(tmp / 'annotator.pth'),
                          img_size=64, topk=2, workers=0)
    return data, tmp / 'labels'
