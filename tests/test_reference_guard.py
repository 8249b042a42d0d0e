"""`reference_disabled` disables the reference function objects themselves (their `__code__`), so a
submission that keeps the reference somewhere no name lookup reaches (a default argument, a
closure, a container, a partial, a bound method, an instance, a subclass...) still fails.

Every attack below worked against the old guard, which only rebound names (the module attribute
and same-object aliases in `__main__` and in the reference's package): the objects the attacks
hold were never looked up again, so they kept running the reference.

The "reference package" is a throwaway one written to a temporary folder, so these tests do not
depend on minillm's internals."""
import asyncio
import functools
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import autograder
from autograder import reference_disabled

PKG = "agguard_refpkg"
MOD = f"{PKG}.core"

REFERENCE_SOURCE = '''
import functools


def top_p(xs, p=0.5, *, scale=1.0):
    """Keep the values >= p, scaled."""
    return [x * scale for x in xs if x >= p]


def calls_top_p(xs):
    return top_p(xs, 0.5)


def make_adder(n):
    def add(x):
        return x + n
    return add


add3 = make_adder(3)        # a reference with a free variable (n)


def count_up(n):
    for i in range(n):
        yield i


async def fetch(x):
    return x * 10


def _logged(f):
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return f(*args, **kwargs)
    return wrapper


@_logged
def decorated(x):
    return x + 1


class Scaler:
    def __init__(self, factor=2):
        self.factor = factor

    def __call__(self, x):
        return x * self.factor

    def scale(self, x):
        return x * self.factor

    @staticmethod
    def double(x):
        return 2 * x

    @classmethod
    def make(cls, factor):
        return cls(factor)

    @property
    def half(self):
        return self.factor / 2

    @half.setter
    def half(self, value):
        self.factor = 2 * value

    def my_class(self):
        return __class__        # a method with a free variable (__class__)


class Unrelated:
    def scale(self, x):
        return -x
'''


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    root = tmp_path_factory.mktemp("refpkg")
    (root / PKG).mkdir()
    (root / PKG / "__init__.py").write_text("")
    (root / PKG / "core.py").write_text(REFERENCE_SOURCE)
    sys.path.insert(0, str(root))
    try:
        import importlib
        yield importlib.import_module(MOD)
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m == PKG or m.startswith(PKG + ".")]:
            del sys.modules[name]


def disabled_message(call) -> str:
    with pytest.raises(AssertionError) as info:
        call()
    return str(info.value)


def assert_blocked(dotted: str, call, *also_disabled: str):
    """`call` works before the block, raises the guard's AssertionError (naming `dotted`) inside
    it, and gives the same result again afterwards."""
    before = call()
    with reference_disabled(dotted, *also_disabled):
        msg = disabled_message(call)
    assert msg.startswith(f"{dotted} is disabled during grading"), msg
    assert msg.endswith(f"implement it yourself instead of calling {dotted}"), msg
    assert call() == before


# --- functions kept where no name lookup reaches them ------------------------------------------
def test_default_argument(ref):
    def top_p_filter(xs, p, _f=ref.top_p):
        return _f(xs, p)
    assert_blocked(f"{MOD}.top_p", lambda: top_p_filter([0.1, 0.7, 0.9], 0.5))


def test_closure(ref):
    def make():
        f = ref.top_p

        def top_p_filter(xs, p):
            return f(xs, p)
        return top_p_filter
    student = make()
    assert_blocked(f"{MOD}.top_p", lambda: student([0.1, 0.7], 0.5))


def test_list_and_dict_containers(ref):
    refs = [ref.top_p]
    table = {"impl": ref.top_p}
    assert_blocked(f"{MOD}.top_p", lambda: refs[0]([0.6], 0.5))
    assert_blocked(f"{MOD}.top_p", lambda: table["impl"]([0.6], 0.5))


def test_functools_partial(ref):
    student = functools.partial(ref.top_p, p=0.5, scale=2.0)      # keyword-only arg as well
    assert_blocked(f"{MOD}.top_p", lambda: student([0.2, 0.8]))


def test_class_attribute_of_a_student_class(ref):
    class Student:
        impl = staticmethod(ref.top_p)
        plain = ref.top_p

        def run(self, xs):
            return self.impl(xs, 0.5)
    assert_blocked(f"{MOD}.top_p", lambda: Student().run([0.9]))
    assert_blocked(f"{MOD}.top_p", lambda: Student.plain([0.9], 0.5))


def test_internal_callers_of_the_reference(ref):
    assert_blocked(f"{MOD}.top_p", lambda: ref.calls_top_p([0.9]))


def test_decorated_reference_and_what_it_wraps(ref):
    inner = ref.decorated.__wrapped__
    assert_blocked(f"{MOD}.decorated", lambda: ref.decorated(1))
    assert_blocked(f"{MOD}.decorated", lambda: inner(1))


# --- reference classes --------------------------------------------------------------------------
def test_bound_method_and_instance_of_a_reference_class(ref):
    inst = ref.Scaler(3)                    # made before the block
    scale = inst.scale                      # a bound method, kept
    assert_blocked(f"{MOD}.Scaler", lambda: scale(2))
    assert_blocked(f"{MOD}.Scaler", lambda: inst(2))              # __call__
    assert_blocked(f"{MOD}.Scaler", lambda: ref.Scaler(4).factor)  # __init__
    klass = ref.Scaler                       # the class object itself, kept
    assert_blocked(f"{MOD}.Scaler", lambda: klass(5).factor)


def test_student_subclass_of_a_reference_class(ref):
    class Mine(ref.Scaler):
        pass

    class Override(ref.Scaler):
        def __init__(self):
            super().__init__(7)

    inst = Mine(3)
    assert_blocked(f"{MOD}.Scaler", lambda: inst.scale(2))
    assert_blocked(f"{MOD}.Scaler", lambda: Mine(3).factor)
    assert_blocked(f"{MOD}.Scaler", lambda: Override().factor)


def test_staticmethod_classmethod_and_property_of_a_reference_class(ref):
    inst = ref.Scaler(3)
    double, make = ref.Scaler.double, inst.make           # kept before the block
    assert_blocked(f"{MOD}.Scaler", lambda: double(4))
    assert_blocked(f"{MOD}.Scaler", lambda: inst.double(4))
    assert_blocked(f"{MOD}.Scaler", lambda: make(5).factor)
    assert_blocked(f"{MOD}.Scaler", lambda: inst.half)

    def set_half():
        inst.half = 1.5
        return inst.factor
    assert_blocked(f"{MOD}.Scaler", set_half)
    assert_blocked(f"{MOD}.Scaler", lambda: inst.my_class() is ref.Scaler)   # __class__ cell


def test_disabling_one_member_of_a_class_leaves_the_others_working(ref):
    inst = ref.Scaler(3)
    for member, call in (("double", lambda: inst.double(4)), ("make", lambda: inst.make(5).factor),
                         ("half", lambda: inst.half), ("scale", lambda: inst.scale(2))):
        assert_blocked(f"{MOD}.Scaler.{member}", call)
        with reference_disabled(f"{MOD}.Scaler.{member}"):
            assert inst(2) == 6 and ref.Unrelated().scale(2) == -2


def test_a_class_disables_only_its_own_functions(ref):
    with reference_disabled(f"{MOD}.Scaler"):
        assert ref.Unrelated().scale(2) == -2         # same method name, other class
        assert ref.top_p([0.9]) == [0.9]              # other functions of the module
        assert repr(object()) and isinstance(ref.Scaler.__new__(ref.Scaler), ref.Scaler)


# --- references with free variables, generators, coroutines ------------------------------------
def test_reference_with_free_variables(ref):
    add = ref.add3
    assert add.__code__.co_freevars == ("n",)
    assert_blocked(f"{MOD}.add3", lambda: add(1))
    other = ref.make_adder(5)                         # another closure of the same code
    with reference_disabled(f"{MOD}.add3"):
        assert other(1) == 6
    assert add.__closure__[0].cell_contents == 3


def test_generator_and_async_references_raise_on_the_call(ref):
    gen = ref.count_up

    def student(n):
        yield from gen(n)
    assert_blocked(f"{MOD}.count_up", lambda: list(student(3)))
    with reference_disabled(f"{MOD}.count_up"):
        with pytest.raises(AssertionError, match="disabled during grading"):
            gen(3)                                    # not deferred to the first next()
    fetch = ref.fetch
    assert_blocked(f"{MOD}.fetch", lambda: asyncio.run(fetch(2)))
    with reference_disabled(f"{MOD}.fetch"):
        with pytest.raises(AssertionError, match="disabled during grading"):
            fetch(2)                                  # no coroutine is even created


# --- restoring, nesting, several names ----------------------------------------------------------
def _codes(ref):
    return {"top_p": ref.top_p.__code__, "init": ref.Scaler.__init__.__code__,
            "double": ref.Scaler.__dict__["double"].__func__.__code__,
            "make": ref.Scaler.__dict__["make"].__func__.__code__,
            "fget": ref.Scaler.half.fget.__code__, "fset": ref.Scaler.half.fset.__code__,
            "add3": ref.add3.__code__, "wrapper": ref.decorated.__code__,
            "wrapped": ref.decorated.__wrapped__.__code__}


def test_code_objects_are_restored_exactly_also_when_the_block_raises(ref):
    before = _codes(ref)
    with pytest.raises(ZeroDivisionError):
        with reference_disabled(f"{MOD}.top_p", f"{MOD}.Scaler", f"{MOD}.add3",
                                f"{MOD}.decorated"):
            during = _codes(ref)
            assert all(during[k] is not before[k] for k in before)
            1 / 0
    after = _codes(ref)
    assert all(after[k] is before[k] for k in before)
    assert ref.top_p([0.1, 0.9], 0.5, scale=2.0) == [1.8]
    assert ref.Scaler(3).scale(2) == 6 and ref.add3(1) == 4 and ref.decorated(1) == 2


def test_nesting_and_repeated_names(ref):
    code = ref.top_p.__code__
    with reference_disabled(f"{MOD}.top_p", f"{MOD}.top_p"):
        guard = ref.top_p.__code__
        with reference_disabled(f"{MOD}.top_p", f"{MOD}.Scaler"):
            assert ref.top_p.__code__ is guard        # the inner block leaves it alone
            assert "disabled" in disabled_message(lambda: ref.Scaler(2))
        assert ref.top_p.__code__ is guard            # still disabled by the outer block
        assert "disabled" in disabled_message(lambda: ref.top_p([1.0]))
        assert ref.Scaler(2).scale(3) == 6            # the inner block's class is back
    assert ref.top_p.__code__ is code and ref.top_p([1.0]) == [1.0]


def test_the_guard_does_not_depend_on_the_reference_module_globals(ref, monkeypatch):
    monkeypatch.setattr(ref, "AssertionError", ValueError, raising=False)
    assert_blocked(f"{MOD}.top_p", lambda: ref.top_p([0.9]))


@pytest.mark.slow       # make test only: a fresh interpreter under -O (8 s on a 2-core AVX2 CPU)
def test_the_guard_survives_python_dash_O(ref):
    root = sys.modules[PKG].__path__[0].rsplit("/", 1)[0]
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {root!r})
        import autograder, {MOD} as ref
        with autograder.reference_disabled({MOD + '.top_p'!r}):
            try:
                ref.top_p([1.0])
            except AssertionError as e:
                print("blocked:", e)
    """)
    out = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0 and f"blocked: {MOD}.top_p is disabled" in out.stdout, out.stderr


# --- what cannot be disabled ---------------------------------------------------------------------
def test_builtins_c_functions_and_modules_are_rejected():
    for dotted in ("math.sqrt", "builtins.len", "os.path"):
        with pytest.raises(ValueError, match=f"cannot disable '{dotted}'"):
            with reference_disabled(dotted):
                pass
    assert math.sqrt(4.0) == 2.0


def test_a_bad_name_after_a_good_one_disables_nothing(ref):
    code = ref.top_p.__code__
    with pytest.raises(ValueError):
        with reference_disabled(f"{MOD}.top_p", f"{MOD}.no_such_function"):
            pass
    assert ref.top_p.__code__ is code


def test_public_name():
    assert autograder.reference_disabled is reference_disabled


def test_every_reference_a_lab_disables_exists():
    """Each dotted name a lab's notebook passes to reference_disabled resolves (a name that moved
    in a refactor would make that hidden test fail for every student, solution included)."""
    import json
    import re

    from autograder.checks import _resolve
    repo = Path(__file__).resolve().parent.parent
    names = set()
    for nb_path in sorted(repo.glob("labs/*/*.ipynb")):
        for cell in json.loads(nb_path.read_text())["cells"]:
            names.update((nb_path.parent.name, n) for n in
                         re.findall(r"['\"]((?:minillm|kernels)\.[A-Za-z0-9_.]+)['\"]",
                                    "".join(cell["source"])))
    assert len(names) > 20, f"expected the labs to name their references, found {sorted(names)}"
    missing = []
    for lab, name in sorted(names):
        try:
            _resolve(name)
        except (ValueError, ImportError, AttributeError) as e:
            missing.append(f"{lab}: {e}")
    assert not missing, "\n".join(missing)
