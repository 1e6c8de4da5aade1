"""The ``tokenfair`` command line, one module per command group (:mod:`.app` builds the app)."""
