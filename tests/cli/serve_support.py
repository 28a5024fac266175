"""granule-cli serve for the Python serve tests: started on a free port, stopped after."""

import contextlib
import re
import subprocess


@contextlib.contextmanager
def granule_serve(cli, model, *options, stderr=subprocess.PIPE):
    """Runs `cli serve model --port 0 --device cpu *options` and yields its port; stops it after.

    Raises AssertionError (the tests' failure) when serve does not report its port.
    """
    proc = subprocess.Popen([cli, "serve", model, "--port", "0", "--device", "cpu", *options],
                            stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        line = proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line)
        if not match:
            raise AssertionError(f"serve did not report its port: {line!r}")
        yield int(match.group(1))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
