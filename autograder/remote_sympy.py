"""SymPy expressions across the grading boundary (autograder/remote.py), by value, never by
`sympify` of a string (which evaluates Python) and never by pickle.

An expression crosses as its tree: numbers as exact integers, rationals and binary floats;
symbols as their name and their assumptions (`positive=True`, ...: part of a symbol's identity,
so `B` from the student's kernel equals the tester's `B`); the infinities and constants by name;
every other node as its class name, from `NODES`, with its arguments. The receiving side rebuilds
the tree with SymPy's own constructors, so the expression is equal to the one sent. Anything
outside `NODES` (a user-defined function, a matrix, a set) cannot be sent.
"""
from __future__ import annotations

__all__ = ["is_sympy", "encode", "decode"]

# the operators and functions an expression of the course may hold (lab 01's roofline
# algebra: sums, products, powers, limits' results, maxima, logarithms, piecewise results)
NODES = ("Add", "Mul", "Pow", "Max", "Min", "log", "exp", "Abs", "floor", "ceiling", "sign",
         "Piecewise", "ExprCondPair", "Equality", "Unequality", "StrictLessThan",
         "LessThan", "StrictGreaterThan", "GreaterThan", "And", "Or", "Not", "Tuple")
CONSTANTS = ("Pi", "Exp1", "Infinity", "NegativeInfinity", "ComplexInfinity", "NaN",
             "ImaginaryUnit", "EulerGamma", "GoldenRatio", "Catalan", "BooleanTrue",
             "BooleanFalse")
MAX_NAME = 200
MAX_EXPONENT = 10_000        # of a number raised to a number (rebuilding evaluates it)


def is_sympy(v) -> bool:
    import sys
    sympy = sys.modules.get("sympy")
    return sympy is not None and isinstance(v, sympy.Basic)


def encode(v, enc_int, depth: int, error):
    """The tree of SymPy object `v`; `enc_int` encodes a Python int (the codec's), `error(msg)`
    builds the exception to raise."""
    import sympy
    if depth > 64:
        raise error("a SymPy expression nested too deep to send")
    name = type(v).__name__
    if isinstance(v, sympy.Symbol) and type(v) is sympy.Symbol:
        return ["Symbol", str(v.name), {str(k): bool(x) for k, x in
                                        dict(v._assumptions0).items() if x is not None}]
    if isinstance(v, sympy.Integer):
        return ["Integer", enc_int(int(v))]
    if isinstance(v, sympy.Rational):
        return ["Rational", enc_int(int(v.p)), enc_int(int(v.q))]
    if isinstance(v, sympy.Float):
        sign, man, exp, bc = v._mpf_
        return ["Float", [enc_int(int(x)) for x in (sign, man, exp, bc)], int(v._prec)]
    if name in CONSTANTS and not v.args:
        return ["S", name]
    if name in NODES:
        return [name] + [encode(a, enc_int, depth + 1, error) for a in v.args]
    raise error(f"a SymPy {name} cannot be sent (only numbers, symbols and the operators of "
                "autograder/remote_sympy.py)")


def decode(tree, error, depth: int = 0):
    """The SymPy object of `tree` (from `encode`); `error(msg)` builds the exception to raise."""
    import sympy
    from sympy.core.assumptions import _assume_defined
    if depth > 64:
        raise error("a SymPy expression nested too deep")
    if type(tree) is not list or not tree or type(tree[0]) is not str:
        raise error("not a SymPy expression")
    head, args = tree[0], tree[1:]
    if head == "Symbol":
        if len(args) != 2 or type(args[0]) is not str or type(args[1]) is not dict or \
                len(args[0]) > MAX_NAME:
            raise error("a malformed SymPy symbol")
        assumptions = args[1]
        if not all(k in _assume_defined and type(x) is bool for k, x in assumptions.items()):
            raise error(f"unknown assumptions of a SymPy symbol: {str(assumptions)[:80]}")
        return sympy.Symbol(args[0], **assumptions)
    if head == "Integer" and len(args) == 1 and type(args[0]) is int:
        return sympy.Integer(args[0])
    if head == "Rational" and len(args) == 2 and all(type(a) is int for a in args) and args[1]:
        return sympy.Rational(args[0], args[1])
    if head == "Float" and len(args) == 2 and type(args[0]) is list and len(args[0]) == 4 and \
            all(type(a) is int for a in args[0]) and type(args[1]) is int and 1 <= args[1] <= 4096:
        return sympy.Float._new(tuple(args[0]), args[1])
    if head == "S" and len(args) == 1 and args[0] in CONSTANTS:
        return getattr(sympy.S, {"BooleanTrue": "true", "BooleanFalse": "false"}
                       .get(args[0], args[0]))
    if head in NODES:
        from sympy.functions.elementary.piecewise import ExprCondPair
        cls = ExprCondPair if head == "ExprCondPair" else getattr(sympy, head)
        items = [decode(a, error, depth + 1) for a in args]
        if head == "Pow" and len(items) == 2 and all(x.is_Number for x in items) and \
                abs(items[1]) > MAX_EXPONENT:       # evaluated here: 10**(10**9) is 400 MB
            raise error(f"a number raised to a power over {MAX_EXPONENT}")
        return cls(*items)
    raise error(f"not a SymPy expression the tests accept: {head[:40]}")
