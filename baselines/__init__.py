"""Baselines, one module each. Importing this package imports every module in it, which registers them."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
