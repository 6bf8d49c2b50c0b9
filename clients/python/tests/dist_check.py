"""The package installed as users install it (`make dist-python`): `python -m build` makes the
wheel and the sdist; each, and a plain copy of clients/python, is installed into a fresh venv
in a temp dir outside the repository, and a smoke script runs there against real servers:
one with the module, one without (the shipped Lua script) and one where it loads the shipped
Functions library (load_functions); check() finds each path. The wheel and the sdist also
run the library's examples (examples/python: their tests, copied next to the venv) against
the server with the module, as examples/run.sh does from the repository. Nothing of the
repository is on the path: a file the package forgot to ship, or a link that dangles outside
the tree, fails here.

    PYTHONPATH=<dir with build> python3 clients/python/tests/dist_check.py <out dir>
"""

import glob
import os
import shutil
import subprocess
import sys
import tempfile

from servers import ROOT, Server

PACKAGE_DIR = os.path.join(ROOT, "clients", "python")
EXAMPLES_DIR = os.path.join(ROOT, "examples", "python")

SMOKE = r'''
import os, sys
import redis
import redis_rl
from redis_rl import Limit, Limiter

venv, script_source, module_port, plain_port, functions_port, key = sys.argv[1:7]
here = os.path.dirname(os.path.realpath(redis_rl.__file__))
assert here.startswith(os.path.realpath(venv)), f"imported from {here}, not the venv"
for name in os.listdir(here):
    assert not os.path.islink(os.path.join(here, name)), f"{name} is a link in the installed package"
with open(script_source) as f:
    assert redis_rl._core.script_text() == f.read(), "the shipped rl.lua differs from clients/lua/rl.lua"
with open(os.path.join(os.path.dirname(script_source), "rl_functions.lua")) as f:
    assert redis_rl.client.functions_text() == f.read(), "the shipped rl_functions.lua differs"
assert redis_rl.load_functions(redis.Redis(port=int(functions_port))) == redis_rl.FUNCTIONS_VERSION
for port, source in ((module_port, "redis"), (plain_port, "lua"), (functions_port, "functions")):
    limiter = Limiter(redis.Redis(port=int(port)), on_error="closed")
    assert limiter.check() == {"redis": "module"}.get(source, source), limiter.path
    got = [limiter.acquire(key, Limit(3, per=60)) for _ in range(4)]
    assert [(d.allowed, d.source) for d in got] == [(True, source)] * 3 + [(False, source)], got
    try:
        Limit(0, 1)
        raise AssertionError("a zero rate was accepted")
    except ValueError as error:  # the text comes from the shipped ranges.json
        assert "rate" in str(error), error
print("smoke ok:", redis.__version__, here)
'''


def run(*args, **kwargs):
    print("+", " ".join(str(a) if "\n" not in str(a) else "<smoke>" for a in args), flush=True)
    subprocess.run(args, check=True, **kwargs)


def main(out):
    shutil.rmtree(out, ignore_errors=True)
    run(sys.executable, "-m", "build", "--quiet", "--outdir", out, PACKAGE_DIR)
    wheel, = glob.glob(os.path.join(out, "*.whl"))
    sdist, = glob.glob(os.path.join(out, "*.tar.gz"))
    module, plain, functions = Server(), Server(module=False), Server(module=False)
    try:
        for kind in ("wheel", "sdist", "source tree"):
            tmp = tempfile.mkdtemp(prefix="redis-rl-dist-")  # outside the repository
            try:
                target = {"wheel": wheel, "sdist": sdist}.get(kind)
                if target is None:  # a copy of the source tree, as `pip install ./clients/python` from a copy
                    target = os.path.join(tmp, "src-copy")
                    shutil.copytree(PACKAGE_DIR, target, symlinks=True,
                                    ignore=shutil.ignore_patterns("*.egg-info", "build", "__pycache__"))
                venv = os.path.join(tmp, "venv")
                run(sys.executable, "-m", "venv", venv)
                python = os.path.join(venv, "bin", "python")
                run(python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", target)
                env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
                run(python, "-c", SMOKE, venv, os.path.join(ROOT, "clients", "lua", "rl.lua"),
                    str(module.port), str(plain.port), str(functions.port), "smoke:" + kind,
                    cwd=tmp, env=env)
                if kind != "source tree":  # what users install; the copy adds nothing here
                    examples = os.path.join(tmp, "examples")
                    shutil.copytree(EXAMPLES_DIR, examples,
                                    ignore=shutil.ignore_patterns("__pycache__"))
                    run(python, "test_example.py", cwd=examples,
                        env={**env, "REDIS_URL": module.url})
                print(f"dist-python: {kind} ok", flush=True)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    finally:
        module.close()
        plain.close()
        functions.close()


if __name__ == "__main__":
    main(os.path.abspath(sys.argv[1]))
