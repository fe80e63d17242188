"""The command line's config changes (`--cfg-options KEY=VALUE`) checked as a config file's model is, then merged.

A key the config does not hold yet is checked against what takes it (the Runner's settings at the top, a built
class's parameters under a `type`, a DataLoader's under a loader); a `type` must be registered, and an item of a
tuple cannot be set alone. Each fault is one line naming the option and the nearest name that exists, before
anything is written."""
from __future__ import annotations

import difflib
import inspect
from collections.abc import Iterable, Iterator

from mmengine.config import Config
from mmengine.runner import Runner
from torch.utils.data import DataLoader

from backbones.common.errors import UsageError

# what mmengine's Runner.build_dataloader takes out of a loader's dict before the rest goes to torch's DataLoader
RUNNER_LOADER_KEYS = {'dataset', 'sampler', 'batch_sampler', 'collate_fn', 'worker_init_fn', 'num_batch_per_epoch',
                      'disable_subprocess_warning'}
CONFIG_KEYS = {'type', '_delete_', '_scope_'}  # mmengine's own keys of any built dict
# keys mmengine's builders take out of a registry's dicts before building them
BUILDER_KEYS = {'OPTIM_WRAPPERS': {'constructor', 'paramwise_cfg'}, 'PARAM_SCHEDULERS': {'convert_to_iter_based'}}
# where a class's `**kwargs` go, where that is not a base class's __init__
KEYWORDS_GO_TO = {'CheckpointHook': Runner.save_checkpoint}


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


def registered_names(registry: object) -> set[str]:
    """The names a registry builds: its own and its parents' (mmengine's torch optimizers, hooks, ...)."""
    names: set[str] = set()
    while registry is not None:
        names |= set(registry.module_dict)
        registry = registry.parent
    return names


def keyword_names(target: object) -> set[str] | None:
    """The keywords `target` takes, its bases' too while each passes `**kwargs` on; None where that is open-ended."""
    functions = ([klass.__dict__['__init__'] for klass in target.__mro__ if '__init__' in klass.__dict__]
                 if inspect.isclass(target) else [target])
    if getattr(target, '__name__', None) in KEYWORDS_GO_TO:
        functions = [functions[0], KEYWORDS_GO_TO[target.__name__]]
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


def accepted_keys(node: dict, where: list[str]) -> tuple[set[str] | None, str]:
    """The keys the dict at `where` may hold, where that is known, and what it is in words."""
    if not where:
        return set(inspect.signature(Runner.__init__).parameters) - {'self'}, 'the config'
    if 'type' in node:
        found = registered(node['type'])
        names = keyword_names(found[1]) if found else None
        accepted = None if names is None else names | CONFIG_KEYS | BUILDER_KEYS.get(found[0], set())
        return accepted, f'{".".join(where)} ({node["type"]})'
    if len(where) == 1 and where[0].endswith('_dataloader'):
        return set(inspect.signature(DataLoader).parameters) | RUNNER_LOADER_KEYS, f'{where[0]} (a data loader)'
    return None, '.'.join(where)


def nearest(name: str, names: Iterable[str]) -> str:
    found = difflib.get_close_matches(name, sorted(names), 1)
    return f'; the nearest is {found[0]!r}' if found else ''


def check_option(cfg: Config, options: dict, key: str) -> None:
    """One option against the config before it is merged (see the module); `options` all the command line's."""
    node, where = dict(cfg.items()), []
    for part in key.split('.'):
        if isinstance(node, tuple):
            raise UsageError(f'--cfg-options {key}: {".".join(where)} is a tuple, which is set whole: give '
                             f'{".".join(where)}=(...) with every item')
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise UsageError(f'--cfg-options {key}: {".".join(where)} is a list of {len(node)} item(s), which '
                                 f'has no item {part}')
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, dict):
            check_new_key(node, where, part, key, options)
            break  # below a new key lies the option's own value
        else:
            break  # a value replaced whole
        where.append(part)
    if key.split('.')[-1] == 'type':
        check_type(options[key], f'--cfg-options {key}', node if isinstance(node, str) else None)


def check_new_key(node: dict, where: list[str], part: str, key: str, options: dict) -> None:
    """A key the option adds at `where`: one its builder takes; in a collection of built dicts, one with its `type`."""
    accepted, what = accepted_keys(node, where)
    if accepted is not None and part not in accepted:
        raise UsageError(f'--cfg-options {key}: {what} takes no {part!r}{nearest(part, accepted | set(node))}')
    prefix = '.'.join([*where, part])
    collection = bool(node) and all(isinstance(value, dict) and 'type' in value for value in node.values())
    if accepted is None and collection and f'{prefix}.type' not in options:
        raise UsageError(f'--cfg-options {key}: {".".join(where)} holds no {part!r}, and a new one needs its type '
                         f'({prefix}.type=...){nearest(part, node)}')


def check_type(kind: object, what: str, replaced: str | None = None) -> None:
    """A `type` that some registry builds, else one line naming the nearest registered name."""
    if registered(kind) is not None:
        return
    found = registered(replaced) if replaced else None
    registry = dict(registries()).get(found[0]) if found else None
    names = registered_names(registry) if registry is not None else \
        {name for _, each in registries() for name in registered_names(each)}
    raise UsageError(f'{what}: {kind!r} is nothing mmseg, mmengine or the suite registers{nearest(str(kind), names)}'
                     " (a module of your own that registers it goes in the config's custom_imports)")


def merge_options(cfg: Config, options: dict | None) -> None:
    """Merge the command line's `options` into `cfg`, each checked first (see the module)."""
    for key in options or {}:
        check_option(cfg, options, key)
    if options:
        cfg.merge_from_dict(options)
