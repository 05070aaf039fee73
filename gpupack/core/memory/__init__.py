"""Memory policy for N trainings on one device: the figures a training needs (figures), whether a pack's expected
peaks fit its share (pack_fit), when a pack or freed slot may start (admission) and which failed trainings were
taken down by a neighbour's fault (victims). Reads earlier records through the run directory's storage (store)."""
