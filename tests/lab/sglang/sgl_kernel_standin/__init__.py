"""A stand-in for `sgl_kernel`, SGLang's CUDA kernel package (CUDA-only on PyPI).

SGLang 0.5.23 imports a few of its ops at start-up even on the CPU, where it never calls them
(it falls back to torch-native attention and layers). Every name here, and every submodule
(`sgl_kernel.kvcacheio`, `.flash_attn`, ...), is a placeholder that raises when called, naming
itself, so a path that does reach a CUDA kernel fails loudly instead of computing garbage.
Installed into the tier's site-packages as `sgl_kernel` by `sglang_lab.py setup`.
"""

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+wedgewatch-standin"


class _Missing:
    """A CUDA op that is not here: attributes are more placeholders, calling one raises."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name} is a CUDA kernel; the CPU stand-in of sgl_kernel "
                           "has none (tests/lab/sglang/sgl_kernel_standin)")

    def __repr__(self):
        return f"<sgl_kernel stand-in {self._name}>"


def _module_getattr(modname):
    def __getattr__(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{modname}.{attr}")
    return __getattr__


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes every `sgl_kernel.<sub>` importable as a module of placeholders."""

    def find_spec(self, name, path=None, target=None):
        if name.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = types.ModuleType(spec.name)
        mod.__path__ = []
        mod.__getattr__ = _module_getattr(spec.name)
        return mod

    def exec_module(self, module):
        pass


__getattr__ = _module_getattr(__name__)
if not any(isinstance(f, _SubmoduleFinder) for f in sys.meta_path):
    sys.meta_path.append(_SubmoduleFinder())
