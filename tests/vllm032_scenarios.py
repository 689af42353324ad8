"""Run in a fresh process by tests/test_vllm032.py against the real vLLM 0.32 (CPU build): builds
configs with EngineArgs(...).create_engine_config() (which loads the `tpcost` general plugin through
its entry point) and prints one JSON object with what vLLM ended up with. Nothing of vLLM is mocked
or patched."""

import json
import sys

from vllm_accepts import accepted
from vllm.engine.arg_utils import EngineArgs

MODEL = sys.argv[1]


def build(tp, pass_config):
    cfg = EngineArgs(
        model=MODEL,
        tensor_parallel_size=tp,
        skip_tokenizer_init=True,
        load_format="dummy",
        max_num_batched_tokens=8192,
        compilation_config={"pass_config": pass_config},
    ).create_engine_config()
    pc = cfg.compilation_config.pass_config
    return {
        "fuse_allreduce_rms": pc.fuse_allreduce_rms,
        "fi_allreduce_fusion_max_size_mb": pc.fi_allreduce_fusion_max_size_mb,
        "has_sp_fields": hasattr(pc, "sp_min_token_num"),
        "endpoints": sorted(cfg.compilation_config.compile_ranges_endpoints or []),
    }


out = {f"plugin_tp{tp}": build(tp, {"fuse_allreduce_rms": True}) for tp in (4, 8)}
out["user_value_tp4"] = build(
    4, {"fuse_allreduce_rms": True, "fi_allreduce_fusion_max_size_mb": 12}
)
out["fusion_off_tp4"] = build(4, {"fuse_allreduce_rms": False})
out["vllm_config_json_accepted"] = accepted(sys.argv[2:])
print("RESULT " + json.dumps(out))
