"""tpcost's analytic cost model (pure numpy): hardware profile → model shape → schedule times →
speedup curve → cutoff. Imports neither torch nor scipy."""

__version__ = "0.1.0"

from .errors import TpcostError  # noqa: F401
from .profile import HardwareProfile, load_profile  # noqa: F401
from .shapes import ModelShape, load_model  # noqa: F401
from .model import predict, Prediction  # noqa: F401
from .analysis import analyse, Analysis  # noqa: F401
