"""tpcost's analytic cost model (pure numpy; no torch or scipy at import): docs/model.md §1."""
# hardware profile → model shape → schedule times → speedup curve → cutoff.

# The public names, imported on first use (PEP 562): `import costmodel.device` or the vLLM plugin's
# cache lookup must not pay for the whole model.
_PUBLIC = {
    "TpcostError": "errors",
    "HardwareProfile": "profile",
    "load_profile": "profile",
    "ModelShape": "shapes",
    "load_model": "shapes",
    "predict": "model",
    "Prediction": "model",
    "RunConfig": "model",
    "Regime": "model",
    "analyse": "analysis",
    "Analysis": "analysis",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name):
    """The public names on first use; `costmodel.__version__`: the installed distribution's version
    (pyproject.toml is the one place it lives)."""
    if name in _PUBLIC:
        import importlib

        return getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("tpcost")
        except PackageNotFoundError:
            return "unknown (not installed)"
    raise AttributeError(name)
