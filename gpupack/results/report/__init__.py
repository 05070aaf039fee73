"""What a person reads, from what :mod:`gpupack.results.analysis.aggregate` computes, one module per job:
:mod:`.terminal` (the rich tables and lines), :mod:`.plots` (PNG, matplotlib headless), :mod:`.html` (one self-contained
report.html, images embedded, that can be copied off a cluster and opened anywhere), :mod:`.files` (summary.csv,
summary.json, trainings.parquet, then the plots and the HTML), and :mod:`.text` (the sentences they share).
:mod:`gpupack.sweep.flow.collect` decides when to write, the CLI when to print."""
