"""Integer helpers for launch grids and block sizes (plain Python ints, no Triton needed)."""


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for non-negative a and positive b: how many blocks of b cover a items."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1): `tl.arange` sizes must be powers of two."""
    return 1 << max(0, (n - 1).bit_length())
