"""What a person reads, from what :mod:`gpupack.results.analysis.aggregate` computes: :mod:`.terminal`, :mod:`.plots`,
:mod:`.html`, :mod:`.files` (summary.csv, summary.json, trainings.parquet), and :mod:`.text`, the words they share."""
