"""A classification data source of a test's own, registered from this one module as a new storage would be: a split
listed in a text file, `D/SPLIT.list`, one image a line, `PATH CLASS` (PATH relative to D; the files anywhere under
it). Run as a script it is tools/train_cls.py with the source registered."""
from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from backbones.common.errors import DataError
from classification.sources.class_folders import FilesIn
from classification.sources.source import ImageSource, Listing, register_source


@register_source
class ListFile(ImageSource):
    name = 'a list file'

    def list_split(self, data_dir: Path, split: str, classes: Sequence[str] | None,
                   classes_from: str) -> Listing | None:
        listed = data_dir / f'{split}.list'
        if not listed.is_file():
            return None
        pairs = [line.rsplit(' ', 1) for line in listed.read_text().splitlines() if line.strip()]
        found = sorted({name for _, name in pairs})
        if classes is not None:
            unknown = sorted(set(found) - set(classes))
            if unknown:
                raise DataError(f'{listed}: classes {", ".join(unknown)} are not in {classes_from}')
            found = list(classes)
        label = {name: i for i, name in enumerate(found)}
        samples = sorted((path, label[name]) for path, name in pairs)
        return Listing(found, samples, FilesIn(data_dir), listed)  # files under the data folder, as class folders'


if __name__ == '__main__':
    from backbones.common.commands import run_command
    from classification.train import main

    run_command(lambda: main(sys.argv[1:]))
