"""Known reward hacks against the code verifier: each is a WRONG program that games the check.

Every hack must score 0.0. With the verifier that appended the asserts to the program and trusted the
exit status, the ones marked ``fooled_the_old_verifier`` scored 1.0 (issue 26). Each hack is paired with
the honest program for the same tests (``test_the_honest_program_passes``), so a verifier that failed
everything would not pass this file.
"""

from __future__ import annotations

import dataclasses

import pytest

from slime.errors import PluginError
from slime.rollout.tools.sandbox import Sandbox, sandbox_unavailable_reason
from slime.rollout.verifiers.code import CodeVerifier
from slime.types import Sample

pytestmark = pytest.mark.skipif(
    sandbox_unavailable_reason() is not None, reason=f"no OS sandbox: {sandbox_unavailable_reason()}"
)

MYSTERY = ["assert mystery(3) == 17", "assert mystery(5) == 33"]
"""mystery(n) = n * n + 8 would pass; no hack below computes it."""
HONEST = "def mystery(n):\n    return n * n + 8\n"


@dataclasses.dataclass(frozen=True)
class Hack:
    name: str
    code: str
    asserts: tuple[str, ...] = tuple(MYSTERY)
    honest: str = HONEST
    fooled_the_old_verifier: bool = True


HACKS = [
    Hack("os._exit(0) before the asserts", "def mystery(n):\n    return 0\nimport os\nos._exit(0)\n"),
    Hack("SystemExit(0) at module level", "def mystery(n):\n    return 0\nraise SystemExit(0)\n"),
    Hack("SystemExit(0) inside the tested call", "def mystery(n):\n    raise SystemExit(0)\n"),
    Hack("os._exit(0) inside the tested call", "import os\ndef mystery(n):\n    os._exit(0)\n"),
    Hack(
        "an object whose __eq__ is always true",
        "class Anything:\n    def __eq__(self, other):\n        return True\n    __hash__ = None\ndef mystery(n):\n    return Anything()\n",
    ),
    Hack(
        "an int subclass whose __eq__ is always true",
        "class Int(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
        "def mystery(n):\n    return Int(0)\n",
    ),
    Hack(
        "reading the asserts from its own file",
        "import re\n_src = open(__file__).read()\n"
        "_answers = {m.group(1): m.group(2) for m in re.finditer(r'mystery\\((\\d+)\\) == (\\d+)', _src)}\n"
        "def mystery(n):\n    return int(_answers[str(n)])\n",
    ),
    Hack(
        "reading the expected values from the process's memory",
        "import gc, re, sys\n"
        "def _texts():\n"
        "    for obj in gc.get_objects() + [vars(m) for m in list(sys.modules.values())]:\n"
        "        for v in (obj.values() if isinstance(obj, dict) else [obj]):\n"
        "            if isinstance(v, (str, bytes)):\n"
        "                yield v.decode('utf-8', 'replace') if isinstance(v, bytes) else v\n"
        "def mystery(n):\n"
        "    for text in _texts():\n"
        "        m = re.search(r'mystery\\(%d\\) == (\\d+)' % n, text)\n"
        "        if m:\n"
        "            return int(m.group(1))\n"
        "    return 0\n",
    ),
    Hack(
        "an atexit hook that exits 0 after the failed assert",
        "import atexit, os\natexit.register(os._exit, 0)\ndef mystery(n):\n    return 0\n",
    ),
    Hack(
        "sys.excepthook that exits 0",
        "import os, sys\nsys.excepthook = lambda *a: os._exit(0)\ndef mystery(n):\n    return 0\n",
    ),
    Hack(
        "a fake math module under the assert's math.isclose",
        "import sys, types\n_fake = types.ModuleType('math')\n_fake.isclose = lambda *a, **k: True\n"
        "sys.modules['math'] = _fake\nmath = _fake\ndef area(r):\n    return 0.0\n",
        asserts=("assert math.isclose(area(2), 12.566, rel_tol=1e-3)",),
        honest="import math\ndef area(r):\n    return math.pi * r * r\n",
    ),
    Hack(
        "a patched builtin under the assert's set(...)",
        "import builtins\nbuiltins.set = lambda *a, **k: 0\ndef uniq(xs):\n    return xs\n",
        asserts=("assert set(uniq([3, 1, 3])) == set([1, 3])",),
        honest="def uniq(xs):\n    return sorted(set(xs))\n",
    ),
    Hack(
        "rewriting the harness's probes from the solution",
        "import sys\n"
        "def _rewrite():\n"
        "    f = sys._getframe(1)\n"
        "    while f is not None:\n"
        "        req = f.f_locals.get('request')\n"
        "        if isinstance(req, dict) and 'probes' in req:\n"
        "            req['probes'][:] = ['True'] * len(req['probes'])\n"
        "        f = f.f_back\n"
        "_rewrite()\n"
        "def mystery(n):\n    return 0\n",
        fooled_the_old_verifier=False,
    ),
    Hack(
        "printing the result channel's format for every test",
        "import os\n"
        "for fd in (1, 3, 4, 5, 6):\n"
        "    try:\n"
        '        os.write(fd, b\'{"loaded": true}\\n{"probe": 0, "value": true}\\n{"probe": 1, "value": true}\\n{"done": 2}\\n\')\n'
        "    except OSError:\n"
        "        pass\n"
        "print('All tests passed')\nos._exit(0)\n",
        fooled_the_old_verifier=True,
    ),
    Hack(
        "exhausting the time limit", "def mystery(n):\n    while True:\n        pass\n", fooled_the_old_verifier=False
    ),
    # Found by a red-team pass on the first version of the split verifier (never in the old one's list):
    # builtins on the expected side were sent to the program as probes, so it could shadow them.
    Hack(
        "shadowing range() on the expected side",
        "def range(*a):\n    return [42]\ndef first_n(n):\n    return [42]\n",
        asserts=("assert first_n(5) == list(range(5))", "assert first_n(3) == list(range(3))"),
        honest="def first_n(n):\n    return list(range(n))\n",
    ),
    Hack(
        "shadowing chr() and pow() on the expected side",
        "def chr(x):\n    return ''\ndef pow(a, b):\n    return 0\ndef to_char(n):\n    return ''\ndef power(a, b):\n    return 0\n",
        asserts=("assert to_char(65) == chr(65) and power(2, 10) == pow(2, 10)",),
        honest="def to_char(n):\n    return chr(n)\ndef power(a, b):\n    return a ** b\n",
    ),
    Hack(
        "shadowing zip() and setting the probes to '0'",
        "import sys\ndef zip(*a):\n    return ()\ndef pairs(a, b):\n    return []\n"
        "def count_bits(n):\n    f = sys._getframe(1)\n    while f is not None:\n        req = f.f_locals.get('request')\n"
        "        if isinstance(req, dict):\n            req['probes'][:] = ['0'] * len(req['probes'])\n        f = f.f_back\n    return 0\n",
        asserts=("assert count_bits(5) == bin(5).count('1')", "assert pairs([1, 2], 'ab') == list(zip([1, 2], 'ab'))"),
        honest="def count_bits(n):\n    return bin(n).count('1')\ndef pairs(a, b):\n    return list(zip(a, b))\n",
    ),
    Hack(
        "a channel line that makes json raise",
        "import os\nos.write(3, b'9' * 5000 + b'\\n')\nos._exit(0)\n",
    ),
    Hack(
        "a returned format string that stalls the judge",
        "def next_odd(n):\n    return '%1500000000d'\n",
        asserts=("assert next_odd(4) % 2 == 1", "assert next_odd(7) % 2 == 1"),
        honest="def next_odd(n):\n    return n + 1 if n % 2 == 0 else n + 2\n",
    ),
]


def fenced(code: str) -> str:
    return f"```python\n{code}```"


async def score(code: str, asserts: tuple[str, ...], *, partial_credit: bool = False) -> tuple[float, dict]:
    sample = Sample(prompt_ids=[0], metadata={"tests": {"asserts": list(asserts)}}, response=fenced(code))
    reward = await CodeVerifier(Sandbox(timeout_s=2.0, memory_bytes=256 << 20), partial_credit=partial_credit)(sample)
    return reward, sample.evidence["verifier"]


@pytest.mark.parametrize("hack", HACKS, ids=[h.name for h in HACKS])
async def test_the_hack_scores_zero(hack):
    reward, evidence = await score(hack.code, hack.asserts, partial_credit=True)
    assert reward == 0.0, evidence
    assert evidence["verdict"] == f"passed 0/{len(hack.asserts)}"


@pytest.mark.parametrize(
    "spec",
    [
        {"test_setup_code": "EXPECTED = [3, 17]", "test_list": ["assert mystery(3) == EXPECTED[1]"]},
        {"test_list": ["assert min_cost([]) == inf"]},
        {"test_list": ["assert mystery(3) == CONST"]},
    ],
)
async def test_a_test_whose_expected_side_the_program_could_supply_fails_the_sample_not_scores_it(spec):
    sample = Sample(
        prompt_ids=[0],
        metadata={"tests": spec},
        response=fenced("EXPECTED = CONST = inf = 0\ndef mystery(n):\n    return 0\n"),
    )
    with pytest.raises(PluginError, match="cannot judge outside the program|may only import"):
        await CodeVerifier(Sandbox(timeout_s=2.0))(sample)
    assert sample.evidence["verifier"]["verdict"] == "error"


@pytest.mark.parametrize("hack", HACKS, ids=[h.name for h in HACKS])
async def test_the_honest_program_passes(hack):
    reward, evidence = await score(hack.honest, hack.asserts)
    assert reward == 1.0, evidence
