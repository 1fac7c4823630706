"""bf16 as NumPy carries it (uint16 bits), for subjects written in NumPy."""

import numpy as np


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16) to float32, exactly."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 to bf16 bits: round to nearest even; every NaN becomes 0x7FFF, as CUDA writes it."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    return np.where(np.isnan(np.asarray(x, dtype=np.float32)), np.uint16(0x7FFF), rounded)
