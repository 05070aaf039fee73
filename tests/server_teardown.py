"""Imported by a fork server's preload (tests/test_forkserver.py): appends the server's pid to the file named by
$GPUPACK_TEST_TEARDOWN if the server itself ran its interpreter's exit handlers (its forked trainings run theirs)."""
import atexit
import os

_SERVER = os.getpid()


def _said() -> None:
    if os.getpid() == _SERVER:
        with open(os.environ["GPUPACK_TEST_TEARDOWN"], "a") as f:
            f.write(f"{_SERVER}\n")


atexit.register(_said)
