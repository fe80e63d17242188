"""The command line's config changes (`--cfg-options KEY=VALUE`) checked as a config file's model is, then merged.

A key the config does not hold yet is checked against what takes it: under a dict built by a registry (a `type`),
the parameters of that class (its `__init__`, and its bases' while it passes `**kwargs` on; a class whose keywords
end nowhere known is not checked); under a data loader, torch's `DataLoader`'s and what mmengine's runner takes from
it. A `type` must be registered. Either fault is one line naming the option and the nearest name that exists, before
anything is written: mmengine found a misspelt key only when it built the object (a traceback after a 400-line
config dump, a log folder left behind), and merged an unknown model type in silence.
"""
from __future__ import annotations

import difflib
import inspect
from collections.abc import Iterator

from mmengine.config import Config
from torch.utils.data import DataLoader

from backbones.common.errors import UsageError

# what mmengine's Runner.build_dataloader takes out of a loader's dict before the rest goes to torch's DataLoader
RUNNER_LOADER_KEYS = {'dataset', 'sampler', 'batch_sampler', 'collate_fn', 'worker_init_fn', 'num_batch_per_epoch',
                      'disable_subprocess_warning'}
CONFIG_KEYS = {'type', '_delete_', '_scope_'}  # mmengine's own keys of any built dict
# keys mmengine's builders take out of a registry's dicts before building them
BUILDER_KEYS = {'OPTIM_WRAPPERS': {'constructor', 'paramwise_cfg'}, 'PARAM_SCHEDULERS': {'convert_to_iter_based'}}


def registries() -> Iterator[tuple[str, object]]:
    """mmseg's registries (each falls back to mmengine's), by name."""
    import mmseg.registry
    for name in dir(mmseg.registry):
        if name.isupper():
            yield name, getattr(mmseg.registry, name)


def registered(kind: object) -> tuple[str, object] | None:
    """The registry that builds `kind` (a registered name, or a class given as such) and what it builds."""
    if not isinstance(kind, str):
        return ('', kind) if callable(kind) else None
    for name, registry in registries():
        built = registry.get(kind)
        if built is not None:
            return name, built
    return None


def keyword_names(target: object) -> set[str] | None:
    """The keywords `target` (a class or a function) takes: its `__init__`'s, and its bases' while each passes
    `**kwargs` on; None where they end in a `**kwargs` nothing here names (anything may be taken)."""
    functions = ([klass.__dict__['__init__'] for klass in target.__mro__ if '__init__' in klass.__dict__]
                 if inspect.isclass(target) else [target])
    names: set[str] = set()
    for function in functions:
        try:
            parameters = inspect.signature(function).parameters.values()
        except (TypeError, ValueError):  # a builtin without a signature
            return None
        names |= {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        if not any(p.kind == p.VAR_KEYWORD for p in parameters):
            return names - {'self'}
    return None


def accepted_keys(node: dict, where: list[str]) -> set[str] | None:
    """The keys the dict at `where` may hold, where that is known."""
    if 'type' in node:
        found = registered(node['type'])
        names = keyword_names(found[1]) if found else None
        return None if names is None else names | CONFIG_KEYS | BUILDER_KEYS.get(found[0], set())
    if len(where) == 1 and where[0].endswith('_dataloader'):
        return set(inspect.signature(DataLoader).parameters) | RUNNER_LOADER_KEYS
    return None


def check_option(cfg: Config, key: str, value: object) -> None:
    """One option against the config before it is merged (see the module)."""
    node, where = dict(cfg.items()), []
    for part in key.split('.'):
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise UsageError(f'--cfg-options {key}: {".".join(where)} is a list of {len(node)} item(s), which '
                                 f'has no item {part}')
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, dict):
            accepted = accepted_keys(node, where)
            if accepted is not None and part not in accepted:
                nearest = difflib.get_close_matches(part, sorted(accepted | set(node)), 1)
                what = f'{node["type"]}' if 'type' in node else 'a data loader'
                raise UsageError(f'--cfg-options {key}: {".".join(where)} ({what}) takes no {part!r}'
                                 + (f'; the nearest it takes is {nearest[0]!r}' if nearest else ''))
            break  # a new key: below it lies the option's own value
        else:
            break  # a value replaced whole
        where.append(part)
    if key.split('.')[-1] == 'type':
        check_type(value, f'--cfg-options {key}')


def check_type(kind: object, what: str) -> None:
    """A `type` that some registry builds, else one line naming the nearest registered name."""
    if registered(kind) is None:
        names = sorted({name for _, registry in registries() for name in registry.module_dict})
        nearest = difflib.get_close_matches(str(kind), names, 1)
        raise UsageError(f'{what}: {kind!r} is nothing mmseg, mmengine or the suite registers'
                         + (f'; the nearest is {nearest[0]!r}' if nearest else '')
                         + " (a module of your own that registers it goes in the config's custom_imports)")


def merge_options(cfg: Config, options: dict | None) -> None:
    """Merge the command line's `options` into `cfg`, each checked first (see the module)."""
    for key, value in (options or {}).items():
        check_option(cfg, key, value)
    if options:
        cfg.merge_from_dict(options)
