"""``python -m gpupack.collect RUN_DIR ...``: the CLI's collect command, under the name it has had since 0.1."""
import sys

from gpupack.cli import console_main

if __name__ == "__main__":
    console_main(["collect", *sys.argv[1:]])
