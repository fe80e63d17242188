"""tools/train_seg.py's two stages: a dense config trained by the segmentation trainer (`backbones.dense.train`) on its
data, or on the data the tool gives when the config's is not on disk; and, where that data asks for it, first the
config's backbone pretrained as a classifier, whose checkpoint the segmentation trainer then starts from."""
from __future__ import annotations

from typing import Protocol

from backbones.dense.run_data import EmbeddedSegData
from backbones.dense.train import (
    PretrainedBackbone,
    Pretraining,
    build_parser,
    parse_with_fallback,
    prepare,
    train,
)


class PretrainingSegData(EmbeddedSegData, Protocol):
    """The data a tool gives train_seg, which can also pretrain a config's backbone for it."""

    def pretrained_backbone(self, pretraining: Pretraining) -> PretrainedBackbone: ...


def main(argv: list[str] | None = None, description: str | None = None,
         fallback: type[PretrainingSegData] | None = None) -> None:
    """tools/train_seg.py: `fallback`'s data and first stage where the config's data is not on disk."""
    args, data = parse_with_fallback(build_parser(description), argv, fallback)
    run = prepare(args, data)
    train(run, data.pretrained_backbone(run.pretraining) if run.pretraining and data is not None else None)
