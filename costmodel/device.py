"""Which GPU this process sees: one small query for the plugin's lookup (docs/model.md §17)."""
# Imported alone by the vLLM plugin's cache lookup (no model code).

from __future__ import annotations


def local_device() -> tuple[str | None, str | None]:
    """(device name, 'major.minor') of GPU 0, or (None, None) (§17)."""
    # Via vLLM's platform if importable, else torch. Imported only when called: `--gpu auto` is the
    # one path of costmodel that asks the machine.
    try:
        from vllm.platforms import current_platform

        cap = current_platform.get_device_capability()
        if cap is not None:
            return current_platform.get_device_name(), f"{cap.major}.{cap.minor}"
    except Exception:
        pass
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            return torch.cuda.get_device_name(0), f"{major}.{minor}"
    except Exception:
        pass
    return None, None
