"""Process-group setup shared by calibrate and validate: torchrun's environment when present (any
TP, multi-node through torchrun's rendezvous), else — CPU only — our own worker processes over
gloo."""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import socket
import sys
import traceback

from costmodel.errors import TpcostError

DEFAULT_TIMEOUT_S = 180.0


def timeout_s() -> float:
    """TPCOST_CALIB_TIMEOUT_S (s a collective may wait before the run fails; default 180),
    checked."""
    raw = os.environ.get("TPCOST_CALIB_TIMEOUT_S", "")
    if raw == "":
        return DEFAULT_TIMEOUT_S
    try:
        v = float(raw)
    except ValueError:
        raise TpcostError(f"TPCOST_CALIB_TIMEOUT_S={raw!r} is not a number of seconds") from None
    if not (v == v and 1.0 <= v <= 86400.0):
        raise TpcostError(f"TPCOST_CALIB_TIMEOUT_S must be in [1, 86400] s, got {raw}")
    return v


def check_environment() -> None:
    """Every TPCOST_* variable calibrate/validate read, checked before a worker starts (one line,
    exit 2)."""
    timeout_s()
    hang = os.environ.get("TPCOST_CALIB_TEST_HANG_RANK", "")
    if hang and not hang.isdigit():
        raise TpcostError(f"TPCOST_CALIB_TEST_HANG_RANK={hang!r} must be a rank number")


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init(device: str):
    """init_process_group for this process; returns (rank, world, device string for tensors)."""
    import torch
    import torch.distributed as dist

    backend = "nccl" if device == "cuda" else "gloo"
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local)
        dev = f"cuda:{local}"
    else:
        torch.set_num_threads(1)
        dev = "cpu"
    dist.init_process_group(
        backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s())
    )
    return rank, world, dev


def _child(rank, world, port, target, args, errq):
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    try:
        target(args)
    except KeyboardInterrupt:
        errq.put((rank, "interrupted"))
        sys.exit(130)
    except Exception as e:
        msg = f"{type(e).__name__}: {e}".splitlines()[0]
        if "timeout" in msg.lower() or "timed out" in msg.lower():
            msg = f"a collective timed out after {timeout_s():.0f} s (a rank hung or died): {msg}"
        errq.put((rank, msg))
        if os.environ.get("TPCOST_DEBUG"):
            traceback.print_exc()
        sys.exit(1)
    finally:
        # the rank is finishing: a second Ctrl-C (the parent forwards one after 1 s) must not
        # interrupt torch's atexit hooks with a traceback; the parent kills a rank that does not end
        import signal

        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:
            pass


def _stop_interrupted(procs) -> None:
    """After Ctrl-C: the workers got the terminal's SIGINT too and close their files and progress
    bar; give them 1 s, then forward SIGINT (only this process was interrupted) and give them 5 s,
    then kill."""
    import signal
    import time

    for step, grace_s in (("wait", 1.0), ("sigint", 5.0), ("kill", 5.0)):
        if step == "sigint":
            for p in procs:
                if p.is_alive():
                    os.kill(p.pid, signal.SIGINT)
        elif step == "kill":
            for p in procs:
                if p.is_alive():
                    p.kill()
        deadline = time.monotonic() + grace_s
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        if not any(p.is_alive() for p in procs):
            return


def require_launcher(device: str, what: str) -> None:
    """--device cuda runs one rank per GPU under torchrun: say how, before anything else is
    checked."""
    if device == "cuda" and not under_torchrun():
        raise TpcostError(
            f"{what} --device cuda runs under torchrun: "
            f"torchrun --nproc-per-node=TP --no-python tpcost {what} --device cuda ..."
        )


def run(target, args, device: str, nproc: int, what: str, wall_timeout_s: float) -> None:
    """Run target(args) on every rank: in this process under torchrun, else in `nproc` spawned CPU
    workers."""
    if under_torchrun():
        target(args)
        return
    require_launcher(device, what)
    if nproc < 1:
        raise TpcostError("--nproc must be >= 1")
    ctx = mp.get_context("spawn")
    errq = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_child, args=(r, nproc, port, target, args, errq), daemon=False)
        for r in range(nproc)
    ]
    for p in procs:
        p.start()
    import time

    deadline = time.monotonic() + wall_timeout_s
    try:
        while any(p.is_alive() for p in procs):
            # one rank failed: the others would hang
            if any(p.exitcode not in (None, 0) for p in procs):
                time.sleep(2.0)  # let the peers report their own error first
                break
            if time.monotonic() > deadline:
                hung = [r for r, p in enumerate(procs) if p.is_alive()]
                for p in procs:
                    p.kill()
                raise TpcostError(
                    f"{what}: rank(s) {hung} still running after {wall_timeout_s:.0f} s; killed "
                    "(raw samples kept; no profile written)"
                )
            time.sleep(0.1)
    except KeyboardInterrupt:
        _stop_interrupted(procs)
        raise
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join()
    errors = []
    while not errq.empty():
        errors.append(errq.get())
    bad = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0]
    if errors or bad:
        first = sorted(errors)[0] if errors else (bad[0][0], f"exit code {bad[0][1]}")
        raise TpcostError(f"{what}: rank {first[0]} failed: {first[1]}")
