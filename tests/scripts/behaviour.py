"""What a script sees of how it was started (tests/test_run.py runs it under `graphsync run` and
plain python and compares): prints one JSON line, then acts on its first argument — `exit N`
calls sys.exit(N), `raise` raises, anything else ends normally."""
import json
import os
import sys

print(json.dumps({"argv": sys.argv, "name": __name__, "file": __file__, "path0": sys.path[0],
                  "main_is_this": sys.modules["__main__"].__dict__ is globals(), "stdin": sys.stdin.read(),
                  "cwd": os.getcwd(), "tensorflow_imported": "tensorflow" in sys.modules}))
sys.stdout.flush()
print("to stderr", file=sys.stderr)


def fail(reason):
    raise ValueError(reason)


if sys.argv[1:2] == ["exit"]:
    sys.exit(int(sys.argv[2]))
if sys.argv[1:2] == ["raise"]:
    fail("raised by the script")
