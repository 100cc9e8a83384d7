"""Imported last by the embedded executor's forkserver: warm every verifier before forking.

multiprocessing's forkserver can only preload modules, so warming up is this module's
import-time effect; it runs after the plugins are imported so their verifiers warm too.
"""

from rewardd.workers.tasks import warm_up

warm_up()
