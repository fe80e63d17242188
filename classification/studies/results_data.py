"""The data files the pages quote, each read once: a results file, docs/results/NAME.json (in the envelope of
`classification.studies.results_file`), or the dense runs' metafile, seg_configs/metafile.yaml; and a figure in one
by its path (`lookup`): keys joined by dots, a list item by its index or by its Name."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from backbones.common.errors import DataError
from classification.studies.results_file import check_envelope

RESULTS = Path('docs/results')
METAFILE = Path('seg_configs/metafile.yaml')
OWN_FIELDS = ('study', 'source', 'commit', 'date', 'machine', 'torch', 'notes')  # the envelope's, beside figures


class DataFiles:
    """The data files under a repository root, each read once: `metafile`, or a docs/results file's stem."""

    def __init__(self, root: Path) -> None:
        self.root, self.loaded = root, {}
        self.read: dict[str, None] = {}  # the files read since it was last cleared, in order: what a block credits

    def path(self, name: str) -> Path:
        return self.root / (METAFILE if name == 'metafile' else RESULTS / f'{name}.json')

    def __getitem__(self, name: str) -> dict:
        self.read[name] = None
        if name not in self.loaded:
            path = self.path(name)
            if not path.is_file():
                raise DataError(f'{path}: {"not a file" if path.exists() else "no such data file"}')
            try:
                text = path.read_text()
                data = yaml.safe_load(text) if path.suffix == '.yaml' else json.loads(text)
            except (ValueError, yaml.YAMLError) as exc:
                raise DataError(f'{path}: not readable as {path.suffix[1:]}: {exc}') from None
            self.loaded[name] = data if name == 'metafile' else check_envelope(data, str(path))
        return self.loaded[name]

    def figures(self, name: str) -> dict:
        return self[name]['figures']

    def lookup(self, name: str, path: str) -> object:
        """A figure of a results file (or a field of its envelope: `commit`, `notes.machine`), or of the metafile."""
        data = self[name]
        if name != 'metafile' and path.split('.')[0] not in OWN_FIELDS:
            data = data['figures']
        return lookup(data, path, str(self.path(name)))


def lookup(data: object, path: str, where: str) -> object:
    """The value at `path` in `data`: keys joined by dots, a list item by its index or its Name."""
    value = data
    for key in path.split('.'):
        if isinstance(value, list):
            found = [item for i, item in enumerate(value)
                     if key in (str(i), isinstance(item, dict) and item.get('Name'))]
            value = found[0] if found else None
        elif isinstance(value, dict) and value.get(key, ...) is None:
            raise DataError(f'{where}: {path} is null (at {key!r})')
        else:
            value = value.get(key) if isinstance(value, dict) else None
        if value is None:
            raise DataError(f'{where}: no {path} (stopped at {key!r})')
    return value

