"""The run directory's storage: its layout (rundir), the records and their atomic writes (records), a lane's journal
(journal), a streaming lane's claims (claims), the columnar files (columnar, lane_columnar), the pickles a Hydra
launch keeps (pickling), a refused write told to the user (storage) and the ranking a run remembers (rank_choice).
Above core's base modules (types, plan); below the memory policy, which reads earlier records."""
