import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402

# the vLLM plugin's decision cache (integration/plugin_cache.py) of every test and every child process goes to a
# fresh directory, never the user's ~/.cache
if "TPCOST_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["TPCOST_CACHE_DIR"] = tempfile.mkdtemp(prefix="tpcost-test-cache-")


@pytest.fixture
def one_line_error(capsys):
    """Run `tpcost ARGV` in process and check the bad-input contract: exit 2, one line on stderr starting
    "tpcost: error:", no traceback, containing `needle`; returns that line."""
    from integration.cli import main

    def check(*argv, needle=""):
        rc = main(list(argv))
        out, err = capsys.readouterr()
        assert rc == 2, (argv, out[-500:], err)
        assert err.count("\n") == 1 and err.startswith("tpcost: error:") and "Traceback" not in err, (argv, err)
        assert needle in err, (argv, err)
        return err

    return check
