import gc
import sys

from gpupack.cli import main

code = main()
# Everything is written and said: the interpreter's teardown need not walk every object of the ~2000 modules a run
# imports (half a second here). Frozen objects are left to the process's end, as they would be.
gc.freeze()
sys.exit(code)
