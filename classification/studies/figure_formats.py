"""How a page writes a figure: a Python format (`.1f`, `,.0f`, `.0%`; a `value`'s whole `{:.1f}%`) or one of FORMATS
by its name; and a paragraph, in lines of at most WIDTH characters."""
from __future__ import annotations

import textwrap
from collections.abc import Callable

from backbones.common.errors import DataError
from classification.studies.reproduction.tables import cell
from classification.studies.statistics import describe_difference, mean_std

WIDTH = 118  # a rendered paragraph's lines


def duration(seconds: float) -> str:
    """'3 min 27 s', '45 s', '2 min'."""
    minutes, rest = divmod(round(seconds), 60)
    if not minutes:
        return f'{rest} s'
    return f'{minutes} min' + (f' {rest} s' if rest else '')


def spread(values: list[float]) -> str:
    """Per-seed values as '71.7 ± 1.7' (mean ± sample standard deviation; the text around it names the seeds)."""
    if not isinstance(values, list) or not values:
        raise DataError(f'spread needs a list of per-seed values, got {values!r}')
    return cell(mean_std(values))


def rate(images_per_second: float) -> str:
    """Images/s as the tables print them: whole numbers with thousands separators from 100 up, else one decimal."""
    return f'{images_per_second:,.0f}' if images_per_second >= 100 else f'{images_per_second:.1f}'


FORMATS: dict[str, Callable[[object], str]] = {
    'cell': cell,  # mean ± std
    'difference': describe_difference,  # '-5.6 [-12.8, +1.5] (within noise)'
    'duration': duration,
    'rate': rate,
    'spread': spread,  # [71.5, 72.1, ...] -> '71.7 ± 1.7'
}


def formatted(value: object, form: str) -> str:
    """`value` written by one of FORMATS or a Python format (a number or a word only)."""
    if form not in FORMATS and '{' not in form:  # a table cell's spec (`.1f`) given to a value block
        form = f'{{:{form}}}'
    if form not in FORMATS and (isinstance(value, (dict, list, bool)) and form != '{}' or isinstance(value, dict)):
        raise DataError(f'format {form!r} cannot write {value!r}: not a single figure')
    try:
        return FORMATS[form](value) if form in FORMATS else form.format(value)
    except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError) as exc:
        raise DataError(f'format {form!r} cannot write {value!r}: {exc!r}') from None


def wrapped(text: str, indent: str = '') -> str:
    """A paragraph in lines of at most WIDTH characters, the later ones indented by `indent`; links unbroken."""
    return textwrap.fill(text, WIDTH, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)
