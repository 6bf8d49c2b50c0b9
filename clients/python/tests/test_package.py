"""What the package ships is real files: the fallback script, the Functions library and the
ranges are copies of clients/lua/rl.lua, clients/lua/rl_functions.lua and
clients/vectors/ranges.json, never links (a link dangles in a copy of
the source tree outside the repository, and `import redis_rl` fails). The copies must stay
equal to their sources: after changing a source, copy it again
(`cp clients/lua/rl.lua clients/lua/rl_functions.lua clients/vectors/ranges.json
clients/python/src/redis_rl/`).

`make dist-python` (dist_check.py) builds the wheel and sdist and installs them as users do."""

import os
import unittest

from servers import ROOT

PACKAGE = os.path.join(ROOT, "clients", "python", "src", "redis_rl")
SOURCES = {"rl.lua": os.path.join(ROOT, "clients", "lua", "rl.lua"),
           "rl_functions.lua": os.path.join(ROOT, "clients", "lua", "rl_functions.lua"),
           "ranges.json": os.path.join(ROOT, "clients", "vectors", "ranges.json")}


class Package(unittest.TestCase):
    def test_shipped_data_files_are_copies_equal_to_their_sources(self):
        for name, source in SOURCES.items():
            shipped = os.path.join(PACKAGE, name)
            self.assertFalse(os.path.islink(shipped), f"{shipped} is a link: ship a copy")
            with open(shipped, "rb") as a, open(source, "rb") as b:
                self.assertEqual(a.read(), b.read(), f"{shipped} differs from {source}: copy it again")

    def test_no_link_anywhere_in_the_package(self):
        for here, dirs, files in os.walk(os.path.join(ROOT, "clients", "python")):
            for name in dirs + files:
                self.assertFalse(os.path.islink(os.path.join(here, name)), os.path.join(here, name))


if __name__ == "__main__":
    unittest.main()
