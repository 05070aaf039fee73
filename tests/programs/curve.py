"""A program with a curve, for a search's pruning (tests/test_search_prune.py): prints ``val: SLOPE × step`` once a
step, flushed, for STEPS steps of SLEEP_S seconds. Usage: python curve.py SLOPE STEPS SLEEP_S"""
import sys
import time

slope, steps, sleep_s = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
for step in range(1, steps + 1):
    time.sleep(sleep_s)
    print(f"val: {slope * step:.6f}", flush=True)
