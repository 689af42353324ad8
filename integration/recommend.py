"""What to give vLLM: the SP/AsyncTP pass config from tpcost's cutoff, shared by `tpcost vllm-config`
and the vLLM plugin. Imports no vllm (the plugin and the CLI import it inside functions)."""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from costmodel.errors import TpcostError

MiB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Recommendation:
    profile_name: str
    profile_tier: str
    profile_origin: str
    modified: bool
    tp: int
    dtype: str
    max_num_batched_tokens: int
    cutoff_tokens: int | None  # None: SP+AsyncTP never pays off below max_num_batched_tokens
    speedup_at_cutoff: float | None
    speedup_at_max_tokens: float
    worst_speedup_below_cutoff: float | None
    fi_fusion_max_size_mb: float | None  # set only where tpcost's verdict differs from vLLM's table
    fi_reason: str | None
    interconnect_kind: str = ""
    asynctp_unavailable: str | None = None  # why torch's fused ops cannot run at this TP (None: they can)
    decision_value: dict | None = None  # costmodel.analysis.decision_value on the workload
    workload: str = ""

    def saving_line(self) -> str:
        """The expected saving of this decision on the workload, in one line."""
        dv = self.decision_value or {}
        if not dv:
            return ""
        ms = lambda x: "n/a" if x is None else f"{x * 1e3:.3f} ms"  # noqa: E731
        out = (f"expected forward {ms(dv.get('expected_forward_s'))} on {self.workload}: saves "
               f"{ms(dv.get('saving_vs_never_s'))} against never")
        if "saving_vs_vllm_default_s" in dv:
            out += f", {ms(dv['saving_vs_vllm_default_s'])} against vLLM's default"
        return out + f", regret {ms(dv.get('regret_vs_oracle_s'))} against the best threshold in hindsight"

    @property
    def enable(self) -> bool:
        return self.cutoff_tokens is not None

    def pass_config(self) -> dict:
        pc: dict = {"enable_sp": self.enable, "fuse_gemm_comms": self.enable}
        if self.enable:
            pc["sp_min_token_num"] = self.cutoff_tokens
        if self.fi_fusion_max_size_mb == 0.0:  # loses from the first token: turn the fusion pass off
            pc["fuse_allreduce_rms"] = False
        elif self.fi_fusion_max_size_mb is not None:
            pc["fi_allreduce_fusion_max_size_mb"] = self.fi_fusion_max_size_mb
        return pc


def detect_profile_name() -> str:
    """The profile for the local GPU: $TPCOST_PROFILE, else match the device name, else the compute capability."""
    env = os.environ.get("TPCOST_PROFILE")
    if env:
        from costmodel.profile import load_profile

        try:
            load_profile(env)
        except TpcostError as e:
            raise TpcostError(f"TPCOST_PROFILE={env!r}: {e}") from None
        return env
    from costmodel.profile import builtin_profile_names, load_profile

    name, cap = _local_device()
    if name is None:
        raise TpcostError("--gpu auto: no GPU visible here; pass --gpu NAME or set TPCOST_PROFILE")
    profiles = [load_profile(n) for n in builtin_profile_names()]
    for p in profiles:
        pats = [s for s in p.attrs.get("identity.device_name_patterns", "").split("|") if s]
        if any(s in name for s in pats):
            return p.name
    for p in profiles:
        if cap and p.attrs.get("identity.compute_capability") == cap:
            return p.name
    raise TpcostError(f"--gpu auto: no built-in profile for {name!r} (cc {cap}); run `tpcost calibrate` and set TPCOST_PROFILE")


def _local_device():
    """(device name, 'major.minor') of GPU 0 via vLLM's platform if importable, else torch; (None, None) if none."""
    try:
        from vllm.platforms import current_platform

        cap = current_platform.get_device_capability()
        if cap is not None:
            return current_platform.get_device_name(), f"{cap.major}.{cap.minor}"
    except Exception:  # noqa: BLE001 - vllm absent or no device
        pass
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            return torch.cuda.get_device_name(0), f"{major}.{minor}"
    except Exception:  # noqa: BLE001
        pass
    return None, None


def fi_fusion_verdict(profile, shape, tp: int, dtype: str, max_num_batched_tokens: int, tolerance: float = 0.25):
    """(MiB, reason) when tpcost predicts FlashInfer AR+RMSNorm stops beating the next implementation + RMSNorm
    more than `tolerance` below vLLM's table limit (within the sizes vLLM can run); else (None, None)."""
    from costmodel import formulas as F
    from costmodel import ops

    d = profile.dispatch(tp)
    if "fi_fusion_max_bytes" not in d or not profile.has_collective("flashinfer_ar_rmsnorm"):
        return None, None
    hw = ops.Hw(profile, dtype)
    n = np.arange(1, max_num_batched_tokens + 1, dtype=float)
    msg = n * shape.hidden * hw.act_bytes
    t_fi, _, _ = ops.all_reduce_dispatch(hw, msg, tp, True, fi_max_bytes=np.inf)
    t_alt, _, _ = ops.all_reduce_dispatch(hw, msg, tp, False, fi_max_bytes=0)
    t_alt = t_alt + hw.t_mem(F.rms_norm_bytes(n, shape.hidden, hw.act_bytes, hw.mode.quant_bytes))
    loses = t_fi > t_alt
    best_tokens = int(np.argmax(loses)) if loses.any() else max_num_batched_tokens  # last N before it loses
    table_tokens = min(int(d["fi_fusion_max_bytes"] // (shape.hidden * hw.act_bytes)), max_num_batched_tokens)
    # only ever lower the limit: raising it past vLLM's tuned value can exceed FlashInfer's workspace limits
    if best_tokens >= table_tokens or table_tokens - best_tokens <= tolerance * max(table_tokens, 1):
        return None, None
    mb = round(best_tokens * shape.hidden * hw.act_bytes / MiB, 3)
    where = "already at 1 token" if best_tokens == 0 else f"above {best_tokens} tokens ({mb} MiB)"
    return mb, (f"tpcost predicts the FlashInfer fused all-reduce+RMSNorm loses to the next all-reduce + RMSNorm "
                f"{where}; vLLM's table allows {d['fi_fusion_max_bytes'] / MiB:g} MiB "
                f"({table_tokens} tokens here) for tp={tp}")


def recommend(profile, shape, tp: int, dtype: str, max_num_batched_tokens: int = 8192, margin: float = 0.02,
              seq_len: int = 1024, workload=None) -> Recommendation:
    from costmodel.analysis import analyse

    a = analyse(profile, shape, tp, dtype, seq_len=seq_len, max_num_batched_tokens=max_num_batched_tokens,
                margin=margin, band=False, tokens=[max_num_batched_tokens], workload=workload)
    grid, s = a.grid_tokens, a.grid_speedup_sp_asynctp
    cut = a.cutoff_tokens
    at_cut = worst_below = None
    if cut is not None:
        i = int(np.searchsorted(grid, cut))
        at_cut = float(s[i])
        worst_below = float(s[:i].min()) if i > 0 else None
    fi_mb, fi_reason = fi_fusion_verdict(profile, shape, tp, dtype, max_num_batched_tokens)
    from costmodel.ops import fused_ops_available

    return Recommendation(profile.name, profile.tier, profile.origin, bool(profile.modified), tp, dtype,
                          max_num_batched_tokens, cut, at_cut, float(s[-1]), worst_below, fi_mb, fi_reason,
                          profile.kind, fused_ops_available(profile, tp), a.decision_value, a.workload)


def explain(r: Recommendation) -> list[str]:
    lines = []
    if r.enable:
        lines.append(f"tpcost: SP+AsyncTP from {r.cutoff_tokens} tokens: predicted speedup {r.speedup_at_cutoff:.3f}x at "
                     f"the cutoff, {r.speedup_at_max_tokens:.3f}x at {r.max_num_batched_tokens} tokens")
        if r.worst_speedup_below_cutoff is not None:
            lines.append(f"tpcost: below the cutoff vLLM keeps plain TP; enabling SP still costs at every size "
                         f"(full-graph compilation, N padded to a multiple of tp={r.tp}, capture sizes not divisible "
                         f"by tp dropped); had SP+AsyncTP run there, the worst predicted speedup is "
                         f"{r.worst_speedup_below_cutoff:.3f}x")
    elif r.asynctp_unavailable:
        lines.append(f"tpcost: SP+AsyncTP off: {r.asynctp_unavailable}")
    else:
        lines.append(f"tpcost: SP+AsyncTP off: no threshold <= {r.max_num_batched_tokens} lowers the expected forward "
                     f"time over the workload with the margin's risk premium (speedup at {r.max_num_batched_tokens}: "
                     f"{r.speedup_at_max_tokens:.3f}x)")
    if r.fi_reason:
        what = ("fuse_allreduce_rms=false" if r.fi_fusion_max_size_mb == 0.0
                else f"fi_allreduce_fusion_max_size_mb={r.fi_fusion_max_size_mb}")
        lines.append(f"tpcost: {what}: {r.fi_reason}")
    if r.interconnect_kind == "pcie" and r.enable:
        lines.append("tpcost: note: on PCIe-only GPUs the fused ops need CUDA peer access between the GPUs (torch "
                     "symmetric memory); check `nvidia-smi topo -p2p r` before enabling AsyncTP")
    if r.saving_line():
        lines.append("tpcost: " + r.saving_line())
    lines.append(f"tpcost: profile {r.profile_name} ({r.profile_origin}), weakest provenance tier {r.profile_tier}"
                 + (", MODIFIED by --set" if r.modified else ""))
    return lines
