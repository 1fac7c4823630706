"""kvoracle's pytest plugin (the `pytest11` entry point of an installed kvoracle; `-p
kvoracle.pytest_plugin` otherwise): a campaign's size and seeds from the pytest command line, for
every kvoracle.check in the run, and the seed printed in the header so that any run can be replayed.

    pytest --kvo-cases 2000 --kvo-seed 0x1234       # KVO_CASES / KVO_SEED for the whole run
    pytest --kvo-case-seed 0x96299063ADC7C1C8 ...   # replay one case (KVO_CASE_SEED)
"""

import os

# Option, the environment variable kvoracle.check (and the C++ helper) reads, help.
_OPTIONS = (
    ("--kvo-cases", "KVO_CASES", "random cases per kvoracle.check"),
    ("--kvo-seed", "KVO_SEED", "campaign seed of every kvoracle.check (decimal or 0x-hex)"),
    ("--kvo-case-seed", "KVO_CASE_SEED", "run exactly this case (from a failure report)"),
)


def pytest_addoption(parser):
    group = parser.getgroup("kvoracle", "kvoracle campaigns")
    for flag, variable, text in _OPTIONS:
        group.addoption(flag, dest=variable, default=None, help=f"{text} (sets {variable})")


def pytest_configure(config):
    for _, variable, _ in _OPTIONS:
        value = config.getoption(variable)
        if value is not None:
            os.environ[variable] = str(value)


def pytest_report_header(config):
    from . import DEFAULT_SEED, __version__

    seed = os.environ.get("KVO_SEED", f"0x{DEFAULT_SEED:X}")
    cases = os.environ.get("KVO_CASES", "each test's own")
    line = f"kvoracle {__version__}: campaign seed {seed}, cases {cases}"
    if "KVO_CASE_SEED" in os.environ:
        line += f", replaying case {os.environ['KVO_CASE_SEED']}"
    return line
