"""Settings for the whole suite."""

import os

# Tests assert that measured costs are cached; on a shared CI machine another process can hold
# a core at any moment, and the cost database would then (rightly) not keep the times. The
# test of that behaviour unsets this.
os.environ.setdefault("PARAGRAPH_CACHE_UNDER_LOAD", "1")
