"""The workload contract under the name a user's workload imports (``from gpupack.workload import Workload``).

It lives in :mod:`gpupack.core.workload`, the ground every part of gpupack stands on; this module only names it.
"""
from gpupack.core.workload import *  # noqa: F403
from gpupack.core.workload import __all__ as __all__
