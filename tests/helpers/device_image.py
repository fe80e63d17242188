"""Importing modules as the GPU machine would: only the distributions of its image and the carried wheels there
(classification/studies/gpu_plan.py, DEVICE_IMAGE and CARRIED_WHEELS)."""
from __future__ import annotations

import importlib.metadata
import re

import tomllib

from classification.studies.gpu_plan import CARRIED_WHEELS, DEVICE_IMAGE
from helpers.commands import ROOT, run_python

# in a fresh interpreter: a finder ahead of the others refuses any top-level module whose distributions are all
# outside the allowed set, as a missing package would be refused (an optional import's `except ImportError` holds)
IMPORT_AS_ON_THE_DEVICE = '''
import importlib, importlib.abc, importlib.metadata, re, sys
allowed = set(sys.argv[1].split(','))
owners = importlib.metadata.packages_distributions()

class DeviceImage(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        owned = {re.sub(r'[-_.]+', '-', owner).lower() for owner in owners.get(fullname.partition('.')[0], ())}
        if owned and not owned & allowed:
            raise ModuleNotFoundError(f'{fullname}: not on the device machine ({", ".join(sorted(owned))})',
                                      name=fullname)
        return None

sys.meta_path.insert(0, DeviceImage())
for module in sys.argv[2:]:
    importlib.import_module(module)
'''


def carried_names() -> set[str]:
    """The carried wheels' distribution names, as pip compares them, and this project's (each call installs it)."""
    project = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']['name']
    return {pip_name(name) for name in [project, *(re.split('[=<>]', wheel)[0] for wheel in CARRIED_WHEELS)]}


def image_with_its_requirements() -> set[str]:
    """The device image's distributions and, as installed here, what they require (the image holds its own
    packages' requirements: this environment's versions may require others); the carried wheels' requirements are
    not added (they are installed without them)."""
    found, todo = set(), list(DEVICE_IMAGE)
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        try:
            required = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        todo += [pip_name(re.match(r'[A-Za-z0-9._-]+', line)[0]) for line in required if 'extra ==' not in line]
    return found


def pip_name(name: str) -> str:
    """A distribution's name as pip compares them."""
    return re.sub(r'[-_.]+', '-', name).lower()


# distributions of this environment whose modules the device image holds under another distribution's name
SAME_MODULES = {'opencv-python': 'opencv-python-headless'}


def import_failures_on_the_device(modules: list[str]) -> str:
    """What importing `modules` says where only the device image's and the carried distributions are: '' where
    every import succeeds."""
    allowed = image_with_its_requirements() | carried_names()
    allowed |= {here for here, there in SAME_MODULES.items() if there in allowed}
    result = run_python(['-c', IMPORT_AS_ON_THE_DEVICE, ','.join(sorted(allowed)), *modules], fresh=True)
    return '' if result.returncode == 0 else result.stderr[-2000:]
