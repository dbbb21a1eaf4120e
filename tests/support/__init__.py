"""Test support for the localargmax suite: one module per concept.

* :mod:`tests.support.paths`: which kernel path (CPU ISA, CUDA path) an op runs on.
* :mod:`tests.support.keys`: an independent Python model of the packed key.
* :mod:`tests.support.problems`: test problems (random, planted, exact integer),
  the shard builder and simulated ranks.
* :mod:`tests.support.reference`: the float64 references and the near-tie rule.
* :mod:`tests.support.launch`: the gloo multi-rank launcher and the leftover-process scan, the benchmark CLI runs.
* :mod:`tests.support.checks`: the bad-input check (``raises_cleanly``) and the bad ``d2t`` table.

Everything is a plain module-level function, so spawned and forked ranks can import it.
"""
