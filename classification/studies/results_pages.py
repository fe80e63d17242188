"""The figures README.md and docs/*.md quote, rendered from their data files into the pages' marked blocks
(tools/render_results.py; the blocks' kinds and syntax: docs/layout.md, "The figures in the pages"):
`render_pages(root)` rewrites every block of the pages under `root`, or names those whose text is not what their
data give."""
from __future__ import annotations

import inspect
import os
import re
import shlex
from collections.abc import Callable
from pathlib import Path

from backbones.common.cli import command_parser
from backbones.common.errors import DataError, UsageError
from backbones.common.files import write_text_atomic
from backbones.common.log import logger
from classification.studies.figure_formats import formatted, wrapped
from classification.studies.gpu_session_view import gpu_session_figures
from classification.studies.launcher import REPOSITORY
from classification.studies.metafile_runs import embedded_runs
from classification.studies.reproduction import tables as reproduction
from classification.studies.results_data import DataFiles, lookup
from classification.studies.results_file import PUBLISHED

PAGES = ('README.md', 'docs/*.md')
MARKER = re.compile(r'<!--\s*/?\s*results?\b')  # every results marker, opening or closing, well formed or not
BLOCK = re.compile(r'<!-- results: (?P<spec>.*?)(?P<end>\s)-->(?P<body>.*?)<!-- /results -->', re.S)
CELL = re.compile(r'\{(?P<expression>[^{}:]+)(?::(?P<form>[^{}]*))?\}')  # a table cell's {EXPRESSION:FORMAT}


class Page:
    """What a block is rendered for: the data files, and the page's place (links to the data are relative to it)."""

    def __init__(self, files: DataFiles, path: Path) -> None:
        self.files, self.path = files, path

    def link(self, name: str) -> str:
        target = Path(os.path.relpath(self.files.path(name), self.path.parent))
        return f'[{target.name}]({target})'

    def credits(self) -> str:
        """The line under a block: where and when each file it read was measured."""
        return wrapped('; '.join(self.measured(name) for name in self.files.read) + '.')

    def measured(self, name: str) -> str:
        """Where and when a data file's figures were measured, with a link to it ('2 CPU cores, torch 2.15.0, commit
        c24ec1c, 2026-11-28 ([results/...](results/...))'); a publication's: its source."""
        document, link = self.files[name], self.link(name)
        if name == 'metafile':
            return f'Each run\'s commit, date and machine: {link}'
        if document['machine'].startswith(PUBLISHED):
            return f'{document["source"]} ({link})'
        stages = document['figures'].get('commits')
        if isinstance(stages, dict):
            commit = 'commits ' + ', '.join(f'{value} ({key})' for key, value in stages.items())
        else:
            commit = f'commit {document["commit"] or document["notes"]["commit"]}'
        torch = f'torch {document["torch"]}, ' if document['torch'] else ''
        return f'{document["machine"]}, {torch}{commit}, {document["date"]} ({link})'


# the kinds of block: each (the data files, the marker's words) -> its text


def value(files: DataFiles, name: str, expression: str, form: str = '{}') -> str:
    return formatted(files.lookup(name, expression), form)


def table(files: DataFiles, *sources: str, template: list[str]) -> str:
    """The template lines, each `{EXPRESSION[:FORMAT]}` filled from `sources` (`{ALIAS#EXPRESSION}`: another)."""
    if not sources:
        raise UsageError('table: name the results file(s) it reads')
    names = dict(source.partition('=')[::2] if '=' in source else (source, source) for source in sources)
    if not template:
        raise UsageError(f'table {sources[0]}: give its lines, each starting with |, on the lines after the marker')
    first = next(iter(names.values()))

    def fill(found: re.Match) -> str:
        alias, _, path = found['expression'].strip().rpartition('#')
        if alias and alias not in names:
            raise UsageError(f'{found["expression"]}: {alias} is not one of the table\'s files ({", ".join(names)})')
        figure = files.lookup(names[alias] if alias else first, path)
        return formatted(figure, found['form'] or '{}').replace('|', '\\|')

    return '\n'.join(CELL.sub(fill, line) for line in template)


def view(files: DataFiles, name: str, kind: str, *args: str) -> tuple[str, bool]:
    """What the study of results file `name` renders as `kind` (VIEWS), and whether it is inline."""
    study = files[name]['study']
    views = VIEWS.get(study, {})
    if kind not in views:
        raise UsageError(f'{files.path(name)}: study {study} has no view {kind!r}'
                         f'{" (its views: " + ", ".join(views) + ")" if views else ""}')
    render, inline = views[kind]
    check_words(render, f'view {kind}', files, name, *args)
    return render(files, name, *args), inline


# the studies' views: each (data files, the results file's name, its words) -> its text


def seeds(files: DataFiles, name: str, variant: str, path: str, form: str = '{:.1f}') -> str:
    """A row's per-seed values in seed order, 'a / b / c' (the runs a reproduction holds)."""
    runs = [run for run in files.lookup(name, 'runs') if run['variant'] == variant]
    if not runs:
        raise DataError(f'{files.path(name)}: no runs of {variant}')
    return ' / '.join(formatted(lookup(run, path, f'{files.path(name)}: {variant} seed {run["seed"]}'), form)
                      for run in sorted(runs, key=lambda r: r['seed']))


def reproduction_table(files: DataFiles, name: str) -> str:
    """The reproduction tool's own table.md."""
    results = files.figures(name)
    return reproduction.markdown_table(results['summary'], results['model'], results['settings']['seeds'],
                                       results['annotators']).strip()


def reproduction_rows(files: DataFiles, name: str, paper: str, *variants: str) -> str:
    """The named rows of the reproduction beside the paper's ImageNet top-1 (Tables 2 and 4; `paper`: its file)."""
    unknown = [variant for variant in variants if variant not in files.figures(name)['summary']]
    if unknown:
        raise DataError(f'{files.path(name)}: no row {", ".join(unknown)}')
    return reproduction.rows_beside_the_paper(files.figures(name), files.figures(paper)['top1'], list(variants))


def reproduction_table7(files: DataFiles, name: str, paper: str) -> str:
    return reproduction.table7_beside_the_paper(files.figures(name), files.figures(paper)['table7'])


def reproduction_figure4(files: DataFiles, name: str) -> str:
    results = files.figures(name)
    return (reproduction.participation_table(results['summary']) + '\n\n' +
            reproduction.annotator_table(results['summary'], results['annotators']))


def transfer_report_table(files: DataFiles, name: str) -> str:
    """The transfer report's own report.md."""
    from classification.studies.transfer_report import markdown_table  # the report's imports: the dense stack's

    return markdown_table(files.figures(name)).strip()


# the studies' views: study -> view -> (renderer, inline)
VIEWS: dict[str, dict[str, tuple[Callable[..., str], bool]]] = {
    'reproduction': {'table': (reproduction_table, False), 'rows': (reproduction_rows, False),
                     'table7': (reproduction_table7, False), 'figure4': (reproduction_figure4, False),
                     'seeds': (seeds, True)},
    'gpu_session': {'figures': (gpu_session_figures, False)},
    'transfer_report': {'table': (transfer_report_table, False)},
}


# the kinds of block: kind -> (renderer, inline); a view's inline is its study's
KINDS: dict[str, tuple[Callable[..., str], bool]] = {'table': (table, False), 'view': (view, False),
                                                   'runs': (embedded_runs, False), 'value': (value, True)}


def marker_parts(spec: str) -> tuple[str, list[str]]:
    """A marker's words, which may go on over several lines, and its table's lines: each starting with |, a line
    after one that does not going on with it (a long row written over several lines of the page's source)."""
    words, template = [], []
    for line in filter(None, (line.strip() for line in spec.split('\n'))):
        if line.startswith('|'):
            template.append(line)
        elif template:
            template[-1] += ' ' + line
        else:
            words.append(line)
    return ' '.join(words), template


def render_block(page: Page, spec: str) -> tuple[str, bool]:
    """(a block's text, whether it is inline) from its marker's words and a table's lines (`marker_parts`)."""
    first, template = marker_parts(spec)
    try:
        words = shlex.split(first)
    except ValueError as exc:  # an unbalanced quote
        raise UsageError(f'results block {first!r}: {exc}') from None
    kind, args = (words[0], words[1:]) if words else ('', [])
    if kind not in KINDS:
        raise UsageError(f'unknown results block {first!r}: {", ".join(KINDS)}')
    if template and kind != 'table':
        raise UsageError('only a table\'s marker holds a table\'s lines')
    page.files.read.clear()
    render, inline = KINDS[kind]
    keywords = {'template': template} if kind == 'table' else {}
    check_words(render, kind, page.files, *args, **keywords)
    text = render(page.files, *args, **keywords)
    if kind == 'view':  # and whether it is inline, its study's view's
        text, inline = text
    return (text, True) if inline else (f'{text}\n\n{page.credits()}', False)


def check_words(render: Callable[..., str], kind: str, *args: object, **kwargs: object) -> None:
    """A UsageError where a block gives its renderer too few or too many words."""
    try:
        inspect.signature(render).bind(*args, **kwargs)
    except TypeError as exc:
        raise UsageError(f'{kind}: {exc}') from None


def render_text(text: str, page: Page) -> tuple[str, list[tuple[str, int]]]:
    """`text` with every block rendered, and the blocks that changed: (marker's first line, line)."""
    changed = []

    def replace(match: re.Match) -> str:
        line = text.count('\n', 0, match.start()) + 1
        try:
            rendered, inline = render_block(page, match['spec'])
        except (DataError, UsageError) as exc:
            raise type(exc)(f'{page.path.relative_to(page.files.root)}:{line}: {exc}') from None
        if not inline:
            indent = text[text.rfind('\n', 0, match.start()) + 1:match.start()]
            if indent.strip():
                raise UsageError(f'{page.path.relative_to(page.files.root)}:{line}: a {match["spec"].split()[0]} '
                                 f'block stands on a line of its own (text before its marker: {indent.strip()!r})')
            rendered = '\n\n' + '\n'.join(indent + line if line else '' for line in rendered.split('\n')) + \
                       '\n\n' + indent
        if rendered != match['body']:
            changed.append((match['spec'].split('\n')[0], line))
        return f'<!-- results: {match["spec"]}{match["end"]}-->{rendered}<!-- /results -->'

    check_markers(text, page)
    return BLOCK.sub(replace, text), changed


def check_markers(text: str, page: Page) -> None:
    """Every results marker of `text` opens or closes a block (one misspelt or unclosed would swallow text)."""
    spans = [(match.start(), match.end()) for match in BLOCK.finditer(text)]
    for marker in MARKER.finditer(text):
        line = text.count('\n', 0, marker.start()) + 1
        where = f'{page.path.relative_to(page.files.root)}:{line}'
        block = next(((start, end) for start, end in spans if start <= marker.start() < end), None)
        if block is None:
            raise UsageError(f'{where}: a results marker outside a block (misspelt, or a block without its '
                             f'<!-- results: ... --> or its <!-- /results -->)')
        body = BLOCK.match(text, block[0])
        opening, closing = body.start(), body.end() - len('<!-- /results -->')
        if marker.start() not in (opening, closing):
            raise UsageError(f'{where}: a results marker inside the block of line '
                             f'{text.count(chr(10), 0, opening) + 1} (a block without its <!-- /results -->?)')


def pages(root: Path) -> list[Path]:
    """The pages under `root` (README.md, docs/*.md); one that is not a readable file is an error naming it."""
    found = [path for pattern in PAGES for path in sorted(root.glob(pattern))]
    unreadable = [path for path in found if not path.is_file()]
    if unreadable:
        raise UsageError(f'{unreadable[0]}: not a page (a folder, or a link to nothing)')
    return found


def render_pages(root: Path, write: bool = True) -> list[str]:
    """Render every block of the pages under `root`; `write`: rewrite those changed. The blocks that differed."""
    if not (root / 'README.md').is_file():  # a mistyped root would otherwise check nothing and pass
        raise UsageError(f'{root}: no README.md there (give the repository\'s folder)')
    files, differing, rewritten = DataFiles(root), [], {}
    for path in pages(root):
        try:
            text = path.read_text()
        except UnicodeDecodeError as exc:
            raise UsageError(f'{path}: not UTF-8 text ({exc.reason} at byte {exc.start})') from None
        rendered, changed = render_text(text, Page(files, path))
        differing += [f'{path.relative_to(root)}:{line}: block "{spec}"' for spec, line in changed]
        if changed:
            rewritten[path] = rendered
    if not any(BLOCK.search(path.read_text()) for path in pages(root)):
        raise UsageError(f'{root}: no results block in its pages (give the repository\'s folder)')
    for path, rendered in rewritten.items() if write else ():  # every page rendered before any is written
        write_text_atomic(path, rendered)
    return differing


def main(argv: list[str] | None = None, description: str | None = None) -> int:
    parser = command_parser(description, 'render_results.py')
    parser.add_argument('--check', action='store_true',
                        help='change nothing; exit 1 naming each page and block whose text differs from its data')
    parser.add_argument('--root', type=Path, default=REPOSITORY,
                        help='the repository whose pages and data files are read (default: this one)')
    args = parser.parse_args(argv)
    differing = render_pages(args.root, write=not args.check)
    for block in differing:
        logger.info(f'{block} {"differs from its data" if args.check else "rewritten"}')
    if args.check and differing:
        logger.error(f'{len(differing)} block(s) differ from their data: run python tools/render_results.py')
        return 1
    logger.info(f'{len(differing) or "no"} block(s) {"differ" if args.check else "rewritten"}')
    return 0
