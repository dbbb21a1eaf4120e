"""The one loader of the compiled extension ``localargmax._C``: it imports the
library (which registers the ops ``torch.ops.localargmax.*``), checks that it
was built against the torch now loaded, and says how to rebuild when not.
Every module that needs ``_C`` imports it from here."""

import importlib

import torch

REBUILD = "rebuild it from the checkout against the torch now installed: pip install --no-build-isolation -e ."

try:  # by name: the library is a sibling file, not a module of this package's source
    _C = importlib.import_module(f"{__package__}._C")
except ImportError as e:  # e.g. an undefined symbol: torch changed under the built extension
    raise ImportError(f"localargmax._C failed to load ({e}); {REBUILD}") from e
if getattr(_C, "TORCH_VERSION", None) != torch.__version__:
    raise ImportError(
        f"localargmax._C was built against torch {getattr(_C, 'TORCH_VERSION', '(unknown: an older build)')} but torch "
        f"{torch.__version__} is loaded (a C++ extension runs only on the torch it was compiled against); {REBUILD}"
    )

WITH_CUDA: bool = bool(_C.WITH_CUDA)
"""Whether this build compiled the CUDA kernels."""

__all__ = ["REBUILD", "WITH_CUDA", "_C"]
