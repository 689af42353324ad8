"""tpcost's analytic cost model (pure numpy): hardware profile → model shape → schedule times →
speedup curve → cutoff. Imports neither torch nor scipy."""


from .errors import TpcostError  # noqa: F401
from .profile import HardwareProfile, load_profile  # noqa: F401
from .shapes import ModelShape, load_model  # noqa: F401
from .model import predict, Prediction  # noqa: F401
from .analysis import analyse, Analysis  # noqa: F401


def __getattr__(name):
    """`costmodel.__version__`: the installed distribution's version (pyproject.toml is the one place it lives)."""
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("tpcost")
        except PackageNotFoundError:
            return "unknown (not installed)"
    raise AttributeError(name)
