"""The test suite's own set-up: what `make test` relies on to finish in time."""
import os

import pytest


@pytest.mark.xdist_group("suite_setup_probe")
def test_xdist_groups_reach_the_scheduler(request):
    """Under `make test` (`-n 2 --dist loadgroup`) a grouped test's node id carries its group,
    which is what the scheduler keeps on one worker (tests/conftest.py)."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or \
            not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not running under pytest-xdist with --dist loadgroup")
    assert request.node.nodeid.endswith("@suite_setup_probe"), request.node.nodeid
