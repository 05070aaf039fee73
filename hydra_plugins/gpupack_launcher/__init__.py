"""gpupack's Hydra launcher plugin: a Hydra app's multirun, packed N jobs per GPU.

    python my_app.py -m hydra/launcher=gpupack_local hydra.launcher.pack=4 lr=0.1,0.01,0.001,0.0001
    python my_app.py -m hydra/launcher=gpupack_slurm hydra.launcher.pack=4 hydra.launcher.partition=gpu ...

Found by Hydra once gpupack is installed (``hydra_plugins`` is a namespace package: no ``__init__.py`` above this).
"""
