"""CuPy's CPU stand-in (tests/cuda_emu/cupy_module.py) as the package `import cupy` finds in
a process a test starts with tests/cuda_emu/site first on its PYTHONPATH (a worker of a
cluster on --device cuda, where the machine has no GPU)."""

import sys

from tests.cuda_emu.cupy_module import module

sys.modules[__name__] = module()
