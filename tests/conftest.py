import os

import numba
from hypothesis import HealthCheck, settings

# Kernels compile on first use (then come from Numba's cache): no deadlines.
settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "dev", max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

#: Thread counts the thread-independence tests compare.
MAX_THREADS = numba.config.NUMBA_NUM_THREADS
