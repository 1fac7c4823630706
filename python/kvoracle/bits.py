"""bf16 and fp8 e4m3 as NumPy carries them (uint16 and uint8 bits), for subjects written in NumPy."""

import numpy as np


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16) to float32, exactly."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 to bf16 bits: round to nearest even; every NaN becomes 0x7FFF, as CUDA writes it."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    return np.where(np.isnan(np.asarray(x, dtype=np.float32)), np.uint16(0x7FFF), rounded)


def _e4m3_values() -> np.ndarray:
    """The 127 non-negative finite e4m3 values, code 0x00..0x7E ascending (bias 7, 2^-9 steps below
    2^-6, 448 the largest)."""
    codes = np.arange(0x7F)
    exp, man = codes >> 3, codes & 7
    normal = (1.0 + man / 8.0) * np.exp2(exp - 7.0)
    return np.where(exp == 0, man * 2.0**-9, normal)


_E4M3 = _e4m3_values()
_E4M3_MIDS = (_E4M3[:-1] + _E4M3[1:]) / 2  # exact in float64


def float32_to_fp8_e4m3(x: np.ndarray) -> np.ndarray:
    """float32 to e4m3 bits (uint8), as __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3): round
    to nearest even, magnitudes past 448 to 448, NaN to 0x7F."""
    x = np.asarray(x, dtype=np.float32)
    a = np.abs(x).astype(np.float64)
    code = np.searchsorted(_E4M3_MIDS, a, side="left")
    inside = code < len(_E4M3_MIDS)
    at = np.where(inside, code, 0)
    tie_to_odd = inside & (a == _E4M3_MIDS[at]) & (code % 2 == 1)
    code = np.minimum(code + tie_to_odd, 0x7E).astype(np.uint8)
    code = code | np.where(np.signbit(x), np.uint8(0x80), np.uint8(0))
    return np.where(np.isnan(x), np.uint8(0x7F), code).astype(np.uint8)


def fp8_e4m3_to_float32(bits: np.ndarray) -> np.ndarray:
    """e4m3 bits (uint8) to float32, exactly; 0x7F and 0xFF are NaN."""
    b = np.asarray(bits, dtype=np.uint8)
    mag = np.append(_E4M3, np.nan)[b & 0x7F].astype(np.float32)
    return np.where(b & 0x80, -mag, mag).astype(np.float32)
