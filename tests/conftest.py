import importlib
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402


def need(module: str):
    """Import `module` for a test that needs it (torch, vLLM). Where it is not installed the test
    skips; under CI=true, which installs everything, a missing dependency fails the run instead."""
    if os.environ.get("CI") == "true":
        return importlib.import_module(module)
    return pytest.importorskip(module)


def sp_release_flag() -> list[str]:
    """`--vllm-version` of the newest release with the SP passes: what a test of the SP cutoff pins,
    so that it asks the same question with or without a vLLM installed."""
    from costmodel.vllm_tables import newest_sp_release

    return ["--vllm-version", newest_sp_release().label]


# the vLLM plugin's decision cache (integration/plugin_cache.py) of every test and every child
# process goes to a fresh directory, never the user's ~/.cache
if "TPCOST_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["TPCOST_CACHE_DIR"] = tempfile.mkdtemp(prefix="tpcost-test-cache-")


@pytest.fixture
def one_line_error(capsys):
    """Run `tpcost ARGV` in process and check the bad-input contract: exit 2, one line on stderr
    starting "tpcost: error:", no traceback, containing `needle`; returns that line."""
    from integration.cli import main

    def check(*argv, needle=""):
        rc = main(list(argv))
        out, err = capsys.readouterr()
        assert rc == 2, (argv, out[-500:], err)
        assert (
            err.count("\n") == 1 and err.startswith("tpcost: error:") and "Traceback" not in err
        ), (argv, err)
        assert needle in err, (argv, err)
        return err

    return check
