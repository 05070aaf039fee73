"""A local pack job's own process: submitit's job entry, then a quick exit. The job's result is written before
:func:`submitit_main` returns; the interpreter's teardown would then walk every object the job imported (about 0.4 s
before the command sees the job end): frozen, they are left to the process's end."""
import gc

from gpupack.submit._submitit import submitit_main

if __name__ == "__main__":
    submitit_main()
    gc.freeze()
