"""Settings for every test run from the repository root.

The lesson notebooks run headless under pytest (nbmake): their widgets show
static output (see fpemu.lessons.interactive), as on the documentation site.
"""

import os

os.environ["FPEMU_STATIC"] = "1"
