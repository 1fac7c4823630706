import os
import sys

from hypothesis import settings

sys.path.insert(0, os.path.dirname(__file__))  # engines_numpy

# Fixed and printed in CI (no database, derandomized); a developer's run explores.
settings.register_profile("ci", derandomize=True, database=None, max_examples=25, deadline=None)
settings.register_profile("dev", max_examples=50, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
