"""Runs every test in this folder and closes with "python: N passed, N failed" (the line CI
reads). Exit status 1 on any failure or error, and when no test ran."""

import os
import sys
import unittest

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
suite = unittest.defaultTestLoader.discover(here, pattern="test_*.py")
result = unittest.TextTestRunner(verbosity=int(os.environ.get("VERBOSE", "1"))).run(suite)
failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
passed = result.testsRun - failed - len(result.skipped)
print(f"python: {passed} passed, {failed} failed, {len(result.skipped)} skipped")
sys.exit(1 if failed or result.testsRun == 0 else 0)
