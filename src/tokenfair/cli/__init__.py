"""The ``tokenfair`` command line, one module per command group (:mod:`.app` builds the app).

Importing it sets the process's numpy BLAS to one thread unless the user chose otherwise
(``OPENBLAS_NUM_THREADS``): nothing the commands do needs threaded BLAS (torch, the engine's
math, uses MKL and ``torch.set_num_threads``), and numpy's OpenBLAS otherwise starts a thread
per core at import that spins for about 0.1 s of CPU beside the simulator's work."""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
