"""The results wing: a run's records read into answers (:mod:`.analysis`) and written for people (:mod:`.report`).

It imports the ground, a search's study and the job wing's face (how a mode is named); the command wing
(:mod:`gpupack.sweep.flow`) drives it.
"""
