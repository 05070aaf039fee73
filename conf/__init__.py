# Makes the config tree importable as gpupack.conf inside an installed wheel (see pyproject.toml).
