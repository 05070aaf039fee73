"""The results wing: a run's records read into answers (:mod:`.analysis`) and written for people (:mod:`.report`).

It imports the ground and a search's study only; the command wing (:mod:`gpupack.sweep.flow`) drives it.
"""
