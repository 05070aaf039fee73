"""The results wing: a run's records read into answers (:mod:`.analysis`) and written for people (:mod:`.report`),
driven by the command wing (:mod:`gpupack.sweep.flow`)."""
