"""File input and output shared by every subcommand (docs/model.md §18)."""
# File input and output shared by every subcommand: bounded UTF-8 reads, atomic writes that never
# replace a file unless asked to, and JSON that is always valid (no NaN, no Infinity).
#
# Every failure is a TpcostError: one line naming the file, exit code 2 from the CLI.

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from .errors import TpcostError
from .formulas import MiB

# a profile, config.json, CSV or metrics file larger than this is not ours
MAX_INPUT_BYTES = 64 * MiB
# config.json / fit.json nest a few levels; thousands deep is an attack or a mistake
MAX_JSON_DEPTH = 64


def finite_float(value: Any, label: str, nonneg: bool = False) -> float:
    """`value` as a finite float (>= 0 with `nonneg`), or one TpcostError naming `label` (§18)."""
    # A text that is no number, one beyond a float's range, inf, NaN, or a negative where it may not
    # be.
    try:
        v = float(value)
    except OverflowError:
        raise TpcostError(f"{label} = {value} is beyond the range of a float") from None
    except (TypeError, ValueError):
        raise TpcostError(f"{label}: {value!r} is not a number") from None
    if not math.isfinite(v) or (nonneg and v < 0):
        raise TpcostError(
            f"{label} = {value!r} must be a finite number" + (" >= 0" if nonneg else "")
        )
    return v


def read_text(path: str | os.PathLike, what: str = "file") -> str:
    """The UTF-8 text of `path` (a BOM is dropped), or one clear TpcostError (§18)."""
    p = Path(path)
    try:
        if p.is_dir():
            raise TpcostError(f"{what} {path} is a directory, not a file")
        size = p.stat().st_size
        if size > MAX_INPUT_BYTES:
            raise TpcostError(
                f"{what} {path} is {size / MiB:.0f} MiB; at most {MAX_INPUT_BYTES // MiB} MiB is "
                "accepted"
            )
        with open(
            p, "rb"
        ) as fh:  # a device or pipe reports size 0: read at most the limit, whatever stat says
            data = fh.read(MAX_INPUT_BYTES + 1)
        if len(data) > MAX_INPUT_BYTES:
            raise TpcostError(
                f"{what} {path} holds more than {MAX_INPUT_BYTES // MiB} MiB (not a regular "
                "file?); "
                "at most that is accepted"
            )
    except OSError as e:
        raise TpcostError(f"cannot read {what} {path}: {e.strerror or e}") from None
    if b"\x00" in data:
        raise TpcostError(f"{what} {path} is binary (it contains NUL bytes), not text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise TpcostError(f"{what} {path} is not UTF-8 text (byte {e.start}: {e.reason})") from None


def bracket_depth(text: str, json_strings: bool = True) -> int:
    """Deepest [ / { nesting of a text, linear: the one nesting scanner (§18)."""
    # Outside JSON strings, or (json_strings=False) every bracket, an upper bound for formats with
    # other quoting (TOML).
    depth = best = 0
    in_str = esc = False
    for ch in text:
        if in_str and json_strings:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"' and json_strings:
            in_str = True
        elif ch in "[{":
            depth += 1
            best = max(best, depth)
        elif ch in "]}":
            depth = max(0, depth - 1)
    return best


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def loads_json(text: str, where: str) -> Any:
    """json.loads that refuses NaN/Infinity and deep nesting, in one-line errors (§18)."""
    # Nesting deeper than MAX_JSON_DEPTH.
    if bracket_depth(text) > MAX_JSON_DEPTH:
        raise TpcostError(f"{where}: JSON nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except ValueError as e:  # JSONDecodeError is a ValueError
        raise TpcostError(f"{where}: malformed JSON: {e}") from None


def read_json(path: str | os.PathLike, what: str = "JSON file") -> Any:
    return loads_json(read_text(path, what), str(path))


def finite_json(obj: Any) -> Any:
    """obj with every non-finite float replaced by None, so json.dumps writes valid JSON (§18)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 1) == 0:  # numpy scalar
        return finite_json(obj.item())
    return obj


# of every --json output; 2: a time or speedup of a schedule that cannot run is null (it was 0 in 1)
JSON_SCHEMA_VERSION = 2


def dumps_json(obj: Any, **kw) -> str:
    """json.dumps of finite_json(obj), refusing NaN/Infinity outright (§18)."""
    return json.dumps(finite_json(obj), allow_nan=False, **kw)


def check_output_path(path: str | os.PathLike, force: bool, flag: str, protect: tuple = ()) -> Path:
    """A path a command may write; else one line (§18)."""
    # Not a directory, its folder exists, not one of the files it reads (`protect`), and not an
    # existing file unless `force`.
    p = Path(path)
    if str(path).strip() == "":
        raise TpcostError(f"{flag}: empty path")
    if p.is_dir():
        raise TpcostError(f"{flag} {path} is a directory; give a file path")
    if not p.parent.is_dir():
        raise TpcostError(f"{flag} {path}: folder {p.parent} does not exist")
    for q in protect:
        try:
            if q is not None and p.exists() and Path(q).exists() and p.samefile(q):
                raise TpcostError(
                    f"{flag} {path} is also an input of this command; it would be destroyed"
                )
        except OSError:
            pass
    if p.exists() and not force:
        raise TpcostError(f"{flag} {path} exists; pass --force to replace it")
    return p


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` beside `path`, fsync, rename over it: old file or whole new one (§18)."""
    # The temporary is removed if anything fails.
    p = Path(path)
    tmp = p.with_name(f".{p.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except OSError as e:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise TpcostError(f"cannot write {path}: {e.strerror or e}") from None
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def savefig_atomic(fig: Any, path: str | os.PathLike, **kw: Any) -> None:
    """matplotlib savefig through a buffer and an atomic rename: a PNG whole or none (§18)."""
    import io as _io

    buf = _io.BytesIO()
    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    try:
        fig.savefig(buf, format=fmt, **kw)
    except ValueError as e:
        raise TpcostError(f"cannot write plot {path}: {e}") from None
    atomic_write_bytes(path, buf.getvalue())


def match_builtin(name: str, names: list[str], what: str) -> str | None:
    """The built-in `name` means: itself, case-insensitive, or the one it begins (§18)."""
    # h100 -> h100-sxm. Several such: one line naming them. None: no built-in (maybe a path). Issue
    # 61.
    if name in names:
        return name
    low = name.casefold()
    same = [n for n in names if n.casefold() == low]
    if len(same) == 1:
        return same[0]
    if not low or "/" in name or "\\" in name or low.endswith((".toml", ".json")):
        return None
    begun = [n for n in names if n.casefold().startswith(low)]
    if len(begun) > 1:
        raise TpcostError(
            f"{what} {name!r} matches several built-ins: {', '.join(begun)}; give one of them"
        )
    return begun[0] if begun else None


def doc_summary(doc: str | None) -> str:
    """A docstring's first paragraph on one line: a command's --help description (§18)."""
    return " ".join((doc or "").split("\n\n")[0].split())
