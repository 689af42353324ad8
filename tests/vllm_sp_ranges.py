"""Run in a fresh process by tests/test_vllm_integration.py: each `tpcost vllm-config` JSON given on
the command line becomes a real vLLM 0.31 config (EngineArgs(...).create_engine_config(), the plugin
off, so the emitted values alone decide), and this prints the compile ranges vLLM built (its own
get_compile_ranges()) with the SP threshold it kept."""

import json
import os
import sys

from vllm.engine.arg_utils import EngineArgs

os.environ["TPCOST_DISABLE"] = "1"
model, tp = sys.argv[1], int(sys.argv[2])
out = []
for text in sys.argv[3:]:
    cfg = EngineArgs(
        model=model,
        tensor_parallel_size=tp,
        skip_tokenizer_init=True,
        load_format="dummy",
        max_num_batched_tokens=8192,
        compilation_config=json.loads(text),
    ).create_engine_config()
    cc = cfg.compilation_config
    out.append(
        {
            "enable_sp": cc.pass_config.enable_sp,
            "sp_min_token_num": cc.pass_config.sp_min_token_num,
            "max_num_batched_tokens": cfg.scheduler_config.max_num_batched_tokens,
            "ranges": [[r.start, r.end] for r in cc.get_compile_ranges()],
            "compile_sizes": sorted(cc.compile_sizes or []),
        }
    )
print("RESULT " + json.dumps(out))
