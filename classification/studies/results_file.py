"""The one shape of a results file (docs/results/*.json, and what the studies write): an envelope, `study` (what
measured it: the views of its figures are the study's), `source` (the command or the publication the figures come
from), `commit`, `date`, `machine` (in words), `torch`, `notes` (optional), around the `figures`. A commit (and
torch) may be null only where `notes.commit` says why. A file is named by its study, machine and commit
(`file_name`): loop_cpu2_c24ec1c.json; a null commit's stand-in is the commit that first quoted the figures
(`notes.first_quoted`: burst_h100_e2f88b5.json), or a publication's key (`notes.key`:
token_labeling_paper_jiang2021.json)."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from backbones.common.errors import DataError
from backbones.common.files import write_json_atomic
from classification.studies.launcher import tool_path
from classification.studies.timing import available_cores

ENVELOPE = ('study', 'source', 'commit', 'date', 'machine', 'torch', 'figures')
OPTIONAL = ('notes',)
COMMIT = re.compile(r'[0-9a-f]{7,40}')
STUDY = re.compile(r'[a-z][a-z0-9_]*')
KEY = re.compile(r'[a-z]+[0-9]{4}[a-z]?')  # a publication's key: its first author and year, jiang2021
CPU_CORES = re.compile(r'^(\d+) CPU cores')
PUBLISHED = 'published'  # a publication's machine, as its figures are quoted


def results_document(study: str, tool: str, argv: list[str] | None, figures: dict, device: str = 'cpu',
                     commit: str | None = None) -> dict:
    """A new results document of `figures` measured now by tools/`tool` with `argv` (None: this process's) on
    `device`: the checkout's commit (or `commit`, where the copy has no history), the date, the machine, torch."""
    import torch

    commit = commit or checkout_commit()
    notes = {} if commit else {'commit': 'not recorded: this copy of the code has no git history'}
    # the command that made it, as a user would type it again from the checkout's root
    command = shlex.join(['python', tool_path(tool), *map(str, sys.argv[1:] if argv is None else argv)])
    document = {'study': study, 'source': command, 'commit': commit,
                'date': time.strftime('%Y-%m-%d'), 'machine': machine_in_words(device), 'torch': torch.__version__,
                **({'notes': notes} if notes else {}), 'figures': figures}
    return check_envelope(document, f'the {study} results')


def write_results(path: Path | str, study: str, tool: str, argv: list[str] | None, figures: dict,
                  device: str = 'cpu') -> dict:
    """`results_document(...)` written to `path` (atomically), and returned."""
    document = results_document(study, tool, argv, figures, device)
    write_json_atomic(Path(path), document)
    return document


def machine_in_words(device: str) -> str:
    """'NVIDIA H200, 16 CPU cores' (a CUDA device, and its host's cores this process may use) or '2 CPU cores'."""
    import torch

    cores = f'{available_cores()} CPU cores'
    return f'{torch.cuda.get_device_name()}, {cores}' if str(device).startswith('cuda') else cores


def checkout_commit() -> str | None:
    """The short commit of the checkout this module runs from, or None (no git, or no history: a copied tree)."""
    try:
        found = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=Path(__file__).parent, text=True,
                               capture_output=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):  # no git, or one that hangs (a copied tree's stale lock)
        return None
    return found if COMMIT.fullmatch(found) else None


def check_envelope(document: object, where: str) -> dict:
    """`document` itself if it has the envelope's shape, else a DataError naming `where` and what is wrong."""
    if not isinstance(document, dict):
        raise DataError(f'{where}: not a results document (a JSON object with {", ".join(ENVELOPE)})')
    missing = [key for key in ENVELOPE if key not in document]
    foreign = [key for key in document if key not in ENVELOPE + OPTIONAL]
    if missing or foreign:
        raise DataError(f'{where}: not in the results envelope: ' + '; '.join(
            ([f'no {", ".join(missing)}'] if missing else []) + ([f'{", ".join(foreign)} outside figures'] if foreign
                                                                  else [])))
    problems = [*(f'{key} {document[key]!r} is not text' for key in ('source', 'machine')
                  if not isinstance(document[key], str) or not document[key]),
                *([] if isinstance(document['study'], str) and STUDY.fullmatch(document['study'])
                  else [f'study {document["study"]!r} is not a lower-case name']),
                *([] if is_date(document['date']) else [f'date {document["date"]!r} is not YYYY-MM-DD']),
                *([] if isinstance(document['figures'], dict) and document['figures'] else ['no figures']),
                *([] if isinstance(document.get('notes', {}), dict) else ['notes is not an object'])]
    for key in ('commit', 'torch'):
        value = document[key]
        if value is None:
            notes = document.get('notes')
            if not (isinstance(notes, dict) and notes.get('commit')):
                problems.append(f'{key} is null and notes.commit does not say why')
        elif not isinstance(value, str) or (key == 'commit' and not COMMIT.fullmatch(value)):
            problems.append(f'{key} {value!r} is not a {"commit" if key == "commit" else "version"}')
    if problems:
        raise DataError(f'{where}: ' + '; '.join(problems))
    return document


def is_date(text: object) -> bool:
    """Whether `text` is a calendar date, YYYY-MM-DD (or a publication's month, YYYY-MM)."""
    for form in ('%Y-%m-%d', '%Y-%m'):
        try:
            datetime.strptime(str(text), form)
            return isinstance(text, str)
        except ValueError:
            continue
    return False


def machine_slug(machine: str) -> str:
    """A machine's part of a file name: 'cpu2' for '2 CPU cores', the GPU's model for a GPU's machine ('h200' for
    'NVIDIA H200, 16 CPU cores', 'rtx4090' for 'NVIDIA GeForce RTX 4090, ...'), 'paper' for a publication's."""
    if machine.startswith(PUBLISHED):
        return 'paper'
    found = CPU_CORES.match(machine)
    if found:
        return f'cpu{found[1]}'
    words = machine.split(',')[0].split()
    for i, word in enumerate(words):
        if any(character.isdigit() for character in word):  # the model number, with a short series word before it
            series = words[i - 1] if i and words[i - 1].isupper() and len(words[i - 1]) <= 4 else ''
            return re.sub(r'[^a-z0-9]', '', (series + word).lower())
    raise DataError(f'machine {machine!r}: name its GPU (as NVIDIA H200) or its CPU cores (as "2 CPU cores")')


def file_name(document: dict) -> str:
    """The name a results document is kept under: its study, its machine and its commit, or where that is null the
    commit that first quoted its figures (`notes.first_quoted`), or a publication's key (`notes.key`)."""
    notes = document.get('notes') or {}
    mark = document['commit'] or notes.get('first_quoted') or notes.get('key')
    if not isinstance(mark, str) or not (COMMIT.fullmatch(mark) or KEY.fullmatch(mark)):
        raise DataError(f'the {document["study"]} results: no commit to name its file by: give notes.first_quoted (the '
                        f'commit that first quoted its figures) or, for a publication, notes.key (as jiang2021)')
    return f'{document["study"]}_{machine_slug(document["machine"])}_{mark}.json'
