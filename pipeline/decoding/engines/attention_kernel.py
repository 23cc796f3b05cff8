"""The onnx engine's own decode-step attention: decode_attention.c, called through ctypes between the
step's onnxruntime segments (onnx_segments.py). It ships compiled: the install (setup.py: a wheel, or
`pip install -e .` in place) builds it beside this file as _decode_attention<EXTENSION_SUFFIX>, and
``kernel()`` loads that (``origin`` "installed"). Where there is none (installed without a C compiler,
or a source tree not installed) or it was built from another decode_attention.c (edited since), it is
compiled once per process with the machine's C compiler instead (``origin`` "built at run time"), and
one warning says why. Where that fails too ``kernel()`` is None, the warning names why, and the engine
keeps onnxruntime's attention ops (one call per step); the rows it decodes say so in their
``attention`` column (Engine.attention_path).

What the C code reads and writes is checked on both sides of the call. Here, once per bound call (a
step binds its arrays once per shape and refills them): every array's dtype, shape, C-contiguity and
writability, and the shapes that tie them together (TypeError or ValueError naming the argument). In C,
at every call, before anything is written: each row's slot, count, position + count and its slot's
source length against the arrays' sizes (a return code, raised here as a ValueError naming the
argument and the row): the values change from step to step, and a loop in C costs nothing beside the
attention, where numpy checks would cost microseconds per layer."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.machinery
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

ATTENTIONS = ("onnxruntime", "kernel")  # an onnx engine's attention: onnxruntime's ops, or this kernel
SOURCE = Path(__file__).with_name("decode_attention.c")
LIBRARY = "_decode_attention"  # the installed library's name beside this file (setup.py builds it)
# The flags of both builds, setup.py's and the run-time one. No -march: a wheel's library runs on other
# x86-64 machines (decode_attention.c picks its AVX2 clone by the CPU). No -ffast-math: the sums keep
# the source's order, so a row's result depends neither on the call nor on the vector width;
# -ffp-contract=off: no fused multiply-adds (clang contracts by default, gcc does not in -std=c11):
# every compiler rounds each product and sum as the source writes them, so nodes decode a record alike.
# -fno-wrapv: setuptools puts Python's own CFLAGS before these, and their -fwrapv (signed overflow
# wraps) took 2.3x the kernel's time.
FLAGS = ("-O3", "-ffp-contract=off", "-fno-wrapv", "-shared", "-fPIC", "-std=c11")
FALLBACK = "the onnx engine runs onnxruntime's attention ops instead (rows' attention column: onnxruntime)"

_pointer, _int, _float = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
_SELF_ARGS = (_pointer,) * 7 + (_int,) * 7 + (_float, _pointer, _pointer)
_CROSS_ARGS = (_pointer,) * 6 + (_int,) * 6 + (_float, _pointer, _pointer)
_F32, _I32 = np.dtype(np.float32), np.dtype(np.int32)
# decode_attention.c's return codes: CHECK_* + CHECK_ROW * row
CHECK_SLOT, CHECK_COUNT, CHECK_POSITION, CHECK_LENGTH, CHECK_ROW = 1, 2, 3, 4, 8


class BuildError(RuntimeError):
    """decode_attention.c did not compile or load (the message says why)."""


class NotInstalled(LookupError):
    """No installed library to load (the message says why)."""


class DecodeAttention:
    """The compiled kernel's two entry points, bound to a step's arrays once: ``self_attention`` and
    ``cross_attention`` check the arrays and return a call without arguments (a step only refills the
    arrays), which raises ValueError, having written nothing, where a row's indices do not fit them.
    Row a of a step reads and writes the caches of slot ``slots[a]`` (each row its own slot)."""

    def __init__(self, library: ctypes.CDLL, flags: tuple[str, ...] = FLAGS, origin: str = "built at run time"):
        self.flags = flags  # what it was compiled with
        self.origin = origin  # "installed" (setup.py built it) or "built at run time"
        self._self, self._cross = library.self_attention, library.cross_attention
        self._self.argtypes, self._self.restype = _SELF_ARGS, ctypes.c_int
        self._cross.argtypes, self._cross.restype = _CROSS_ARGS, ctypes.c_int

    def self_attention(self, qkv: np.ndarray, cache_k: np.ndarray, cache_v: np.ndarray, slots: np.ndarray,
                       positions: np.ndarray, counts: np.ndarray, bias: np.ndarray | None, scale: float,
                       out: np.ndarray):
        """qkv [A, W, 3 * H * dk]; cache_k, cache_v [slots, C, H, dk] (written in place); slots,
        positions, counts [A] int32; bias [A, H, W' >= W, C] or None; out [A, W, H * dk]."""
        slot_count, capacity, heads, dk = _checked("cache_k", cache_k, _F32, (None,) * 4, writable=True).shape
        _checked("cache_v", cache_v, _F32, cache_k.shape, writable=True)
        rows = len(_checked("slots", slots, _I32, (None,)))
        width = _checked("qkv", qkv, _F32, (rows, None, 3 * heads * dk)).shape[1]
        _checked("positions", positions, _I32, (rows,))
        _checked("counts", counts, _I32, (rows,))
        _checked("out", out, _F32, (rows, width, heads * dk), writable=True)
        if bias is not None and _checked("bias", bias, _F32, (rows, heads, None, capacity)).shape[2] < width:
            raise ValueError(f"attention kernel: `bias` must have at least W = {width} query rows, got "
                             f"{bias.shape[2]}")
        scale = float(scale)
        scores = np.empty(heads * max(capacity, 1), dtype=np.float32)
        arguments = (_at(qkv), _at(cache_k), _at(cache_v), _at(slots), _at(positions), _at(counts),
                     None if bias is None else _at(bias), 0 if bias is None else bias.shape[2], rows, width, heads,
                     dk, slot_count, capacity, scale, _at(scores), _at(out))
        limits = {"slots": slot_count, "counts": width, "capacity": capacity}
        return _bound(self._self, (qkv, cache_k, cache_v, slots, positions, counts, bias, scores, out), arguments,
                      lambda code: _refused(code, slots, counts, positions, None, limits))

    def cross_attention(self, query: np.ndarray, cross_k: np.ndarray, cross_v: np.ndarray, slots: np.ndarray,
                        lengths: np.ndarray, counts: np.ndarray, scale: float, out: np.ndarray):
        """query, out [A, W, H * dk]; cross_k, cross_v [slots, S, H, dk]; slots, counts [A] int32;
        lengths [slots] int32 (each slot's source length)."""
        slot_count, sources, heads, dk = _checked("cross_k", cross_k, _F32, (None,) * 4).shape
        _checked("cross_v", cross_v, _F32, cross_k.shape)
        rows = len(_checked("slots", slots, _I32, (None,)))
        width = _checked("query", query, _F32, (rows, None, heads * dk)).shape[1]
        _checked("lengths", lengths, _I32, (slot_count,))
        _checked("counts", counts, _I32, (rows,))
        _checked("out", out, _F32, (rows, width, heads * dk), writable=True)
        scale = float(scale)
        scores = np.empty(heads * max(sources, 1), dtype=np.float32)
        arguments = (_at(query), _at(cross_k), _at(cross_v), _at(slots), _at(lengths), _at(counts), rows, width,
                     heads, dk, slot_count, sources, scale, _at(scores), _at(out))
        limits = {"slots": slot_count, "counts": width, "sources": sources}
        return _bound(self._cross, (query, cross_k, cross_v, slots, lengths, counts, scores, out), arguments,
                      lambda code: _refused(code, slots, counts, None, lengths, limits))


def _bound(function, arrays: tuple, arguments: tuple, refused):
    """function(*arguments) as a call with none, raising ``refused(code)`` where the kernel returns a
    code; ``arrays``: what the pointers point into, kept alive."""

    def call():
        code = function(*arguments)
        if code:
            raise refused(code)

    call.arrays = arrays
    return call


def _refused(code: int, slots, counts, positions, lengths, limits: dict) -> ValueError:
    """The error of a call the kernel refused (decode_attention.c's code: which check, which row)."""
    row, check = divmod(code, CHECK_ROW)
    slot, count = int(slots[row]), int(counts[row])
    if check == CHECK_SLOT:
        why = f"`slots`[{row}] = {slot} is not one of the caches' {limits['slots']} slots"
    elif check == CHECK_COUNT:
        why = f"`counts`[{row}] = {count} is outside 0..{limits['counts']} (the width W)"
    elif check == CHECK_POSITION:
        position = int(positions[row])
        why = (f"`positions`[{row}] + `counts`[{row}] = {position} + {count} is outside 0..{limits['capacity']} "
               f"(the caches' capacity)")
    else:
        why = (f"`lengths`[{slot}] = {int(lengths[slot])} (row {row}'s slot) is outside 0..{limits['sources']} "
               f"(the cross caches' source positions)")
    return ValueError(f"attention kernel: {why}; nothing was written")


def _at(array: np.ndarray) -> int:
    return array.ctypes.data


def _checked(name: str, array, dtype: np.dtype, shape: tuple, writable: bool = False) -> np.ndarray:
    """``array`` where it is a C-contiguous ndarray of ``dtype`` and ``shape`` (None: any size there),
    else TypeError or ValueError naming it. A few attribute reads: no copy, no pass over the data."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"attention kernel: `{name}` must be a numpy array, got {type(array).__name__}")
    if array.dtype != dtype:
        raise TypeError(f"attention kernel: `{name}` must be {dtype}, got {array.dtype}")
    if array.ndim != len(shape) or any(want is not None and got != want for got, want in zip(array.shape, shape)):
        wanted = ", ".join("*" if want is None else str(want) for want in shape)
        raise ValueError(f"attention kernel: `{name}` must be of shape [{wanted}], got {list(array.shape)}")
    if not array.flags.c_contiguous:
        raise ValueError(f"attention kernel: `{name}` must be C-contiguous (strides {array.strides})")
    if writable and not array.flags.writeable:
        raise ValueError(f"attention kernel: `{name}` is written in place and must be writable")
    return array


def compiler() -> str | None:
    """The C compiler the kernel is built with: $CC, else cc, else gcc on the PATH; None: none."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def build_key(compiler_command: str, flags: tuple[str, ...] = FLAGS) -> str:
    """What a built library is kept under: the compiler, its flags and the source. Another flag, compiler
    or source builds anew; the same ones reuse the library this process loaded."""
    digest = hashlib.sha256("\0".join((compiler_command, *flags)).encode() + b"\0" + SOURCE.read_bytes())
    return digest.hexdigest()[:16]


def build(compiler_command: str | None = None, flags: tuple[str, ...] = FLAGS) -> DecodeAttention:
    """decode_attention.c compiled with ``flags`` (default: ``compiler()``) and loaded, or BuildError
    saying why not."""
    compiler_command = compiler_command or compiler()
    if compiler_command is None:
        raise BuildError("no C compiler: $CC is unset and neither cc nor gcc is on the PATH")
    return _built(compiler_command, tuple(flags), build_key(compiler_command, tuple(flags)))


@functools.cache
def _built(compiler_command: str, flags: tuple[str, ...], key: str) -> DecodeAttention:
    """One build per (compiler, flags, source): ``key`` is build_key's."""
    folder = tempfile.mkdtemp(prefix=f"bild-attention-{key}-")
    library = os.path.join(folder, f"decode_attention-{key}.so")
    try:
        subprocess.run([compiler_command, *flags, "-o", library, str(SOURCE), "-lm"], check=True,
                       capture_output=True, text=True, timeout=120)
        return DecodeAttention(ctypes.CDLL(library), flags)
    except (OSError, subprocess.SubprocessError) as error:
        detail = getattr(error, "stderr", "") or error
        raise BuildError(f"{compiler_command}: {str(detail).strip()[:500]}") from error
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # the loaded library stays mapped


def installed_library() -> Path | None:
    """The library the install built beside this file (a wheel's, or an editable install's in place);
    None where there is none."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = Path(__file__).with_name(LIBRARY + suffix)
        if path.is_file():
            return path
    return None


def load_installed() -> DecodeAttention:
    """The installed kernel, or NotInstalled saying why not: there is none, it does not load, or it was
    built from another decode_attention.c than the one beside it (edited since the install)."""
    path = installed_library()
    if path is None:
        raise NotInstalled(f"no {LIBRARY} library beside {Path(__file__).name}: installed without a C compiler, "
                           f"or run from a source tree that was not installed")
    try:
        library = ctypes.CDLL(str(path))
        digest = ctypes.string_at(ctypes.addressof(ctypes.c_char.in_dll(library, "source_digest"))).decode()
    except (OSError, ValueError) as error:
        raise NotInstalled(f"{path.name} did not load: {error}") from error
    if SOURCE.is_file() and digest != hashlib.sha256(SOURCE.read_bytes()).hexdigest():
        raise NotInstalled(f"{path.name} was built from another {SOURCE.name} (edited since the install: "
                           f"`pip install -e .` rebuilds it)")
    return DecodeAttention(library, FLAGS, "installed")


@functools.cache
def kernel() -> DecodeAttention | None:
    """The kernel: the installed one, else compiled on first use in this process (well under a second),
    with one warning saying why; None where neither is had, the warning naming why and the fallback
    (BILD_ATTENTION_KERNEL=0 skips it)."""
    if os.environ.get("BILD_ATTENTION_KERNEL", "1") == "0":
        log.info("BILD_ATTENTION_KERNEL=0: %s", FALLBACK)
        return None
    try:
        return load_installed()
    except NotInstalled as why:
        not_installed = str(why)
    try:
        built = build()
    except BuildError as error:
        log.warning("the decode-attention kernel is not installed (%s) and did not build (%s): %s",
                    not_installed, error, FALLBACK)
        return None
    log.warning("the decode-attention kernel is not installed (%s): built at run time", not_installed)
    return built
