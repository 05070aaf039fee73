"""A local pack job's own process: submitit's job entry (``python -m submitit.core._submit FOLDER``), then a quick exit.

The job's result is written by submitit before :func:`submitit_main` returns; the interpreter's teardown would then
walk every object the job imported (optuna, pandas, a framework: about 0.4 s here), a delay before the controller,
and so the command, sees the job end. Frozen, they are left to the process's end.
"""
import gc

from gpupack.submit._submitit import submitit_main

if __name__ == "__main__":
    submitit_main()
    gc.freeze()
