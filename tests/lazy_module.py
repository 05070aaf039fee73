"""Imported late by a probe training (tests/test_forkserver.py): the program's own module, which the fork server
never learns (it may do anything at import)."""
LOADED = True
