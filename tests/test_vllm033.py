"""Against the real vLLM 0.33.0 (the current release, a CUDA wheel): its config classes import on
this CPU machine when the wheel is laid over the vLLM 0.32 test venv without its dependencies
(README test command: `pip install --no-deps --target .vllm033 vllm==0.33.0`, then
PYTHONPATH=.vllm033). Its pinned torch (2.14.0, CUDA) is not installed: torch 2.13.0+cpu of the 0.32
venv serves the config classes, which is all this file uses."""

import io
import json
from contextlib import redirect_stdout

import pytest

from costmodel import vllm_tables as T
from integration.cli import main
from integration.recommend import installed_version

VERSION = installed_version()
pytestmark = pytest.mark.skipif(
    VERSION != (0, 33), reason="needs the vLLM 0.33.0 wheel on PYTHONPATH (README)"
)


def _config(*argv):
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["vllm-config", "--format", "json", "--gpu", "h100-sxm", *argv]) == 0
    return json.loads(buf.getvalue())


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_vllm_config_033_is_accepted_by_033s_config_classes(tp):
    from vllm.config import CompilationConfig, PassConfig

    cc = _config("--model", "llama-3.1-70b", "--tp", str(tp))  # the installed version: 0.33
    assert not any(k.startswith(("enable_sp", "fuse_gemm", "sp_min")) for k in cc["pass_config"])
    built = CompilationConfig(**cc)
    for k, v in cc["pass_config"].items():
        assert getattr(built.pass_config, k) == v
    assert "sp_min_token_num" not in PassConfig.__dataclass_fields__


def test_tables_equal_the_running_033():
    """costmodel/vllm_tables.py's 0.33 tables against the imported modules (besides the fixture read
    from the wheel)."""
    from vllm.distributed.device_communicators import all_reduce_utils as ar

    assert ar.CUSTOM_ALL_REDUCE_MAX_SIZES == T.Vllm((0, 33)).table("CUSTOM_ALL_REDUCE_MAX_SIZES")[0]
    assert (
        ar.SYMM_MEM_ALL_REDUCE_MAX_SIZES
        == T.Vllm((0, 33)).table("SYMM_MEM_ALL_REDUCE_MAX_SIZES")[0]
    )
    assert (
        ar.FI_MNNVL_ALLREDUCE_MAX_SIZE_MB
        == T.Vllm((0, 33)).table("FI_MNNVL_ALLREDUCE_MAX_SIZE_MB")[0]
    )


def test_kernel_switch_contract_on_033(monkeypatch):
    """The plugin's reading of vLLM 0.33's ParallelConfig / KernelConfig gives the mode the worker
    binds, the call sites count vLLM 0.33's own KDA rule, and 0.33's envs read the switch the plugin
    writes (unset: on)."""
    from pathlib import Path

    import vllm.envs as envs
    from vllm.config import KernelConfig, ParallelConfig
    from vllm.transformers_utils.configs.kimi_linear import KimiLinearConfig

    from costmodel.shapes import read_kernel_model
    from costmodel.vllm_tables import Parallel
    from costmodel.shapes import load_model_config
    from integration.vllm_plugin import kernel_parallel

    path = str(Path(__file__).parent / "fixtures" / "kimi-k3.config.json")
    cfg, name, where = load_model_config(path)
    km = read_kernel_model(cfg, name, where)
    for pc, kc, mode in (
        (ParallelConfig(tensor_parallel_size=8), KernelConfig(), "gemm_ar"),
        (
            ParallelConfig(
                tensor_parallel_size=8, enable_expert_parallel=True, data_parallel_size=2
            ),
            KernelConfig(),
            "gemm_rs",
        ),
        (
            ParallelConfig(tensor_parallel_size=8, enable_expert_parallel=True),
            KernelConfig(moe_backend="deep_gemm_mega_moe"),
            "gemm_rs",
        ),
        (
            ParallelConfig(tensor_parallel_size=8, enable_expert_parallel=True),
            KernelConfig(),
            "gemm_ar",
        ),
    ):
        assert km.mode(Parallel(**kernel_parallel(pc, kc))) == mode
    n_kda = sum(
        KimiLinearConfig(**cfg["text_config"]).is_kda_layer(i) for i in range(km.num_layers)
    )
    sites = {
        s.name: s.calls_per_forward for s in km.call_sites("gemm_ar", Parallel(8), T.Vllm((0, 33)))
    }
    assert sites["o_proj (KDA)"] == n_kda and sites["o_proj (MLA)"] == km.num_layers - n_kda
    monkeypatch.delenv("VLLM_KIMI_K3_GEMM_AR", raising=False)
    assert envs.VLLM_KIMI_K3_GEMM_AR is True and envs.VLLM_ENABLE_GEMM_RS is False
    monkeypatch.setenv("VLLM_KIMI_K3_GEMM_AR", "0")
    assert envs.VLLM_KIMI_K3_GEMM_AR is False
