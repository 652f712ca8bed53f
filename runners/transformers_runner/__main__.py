"""The runner as a program: `python3 PATH/transformers_runner REQUEST.json` (how cardproof starts
it) or `python3 -m transformers_runner REQUEST.json`."""

import importlib
import os
import sys

if __package__:
    from .protocol import main
    from .run import run
else:
    # Started as a directory or a file: Python put this directory itself on the path, where the
    # package's modules would import as top-level modules (`run`, `model`, ...). Import the
    # package, under its directory's name, from its parent directory instead: this copy of it
    # and no other.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
    sys.path.insert(0, os.path.dirname(_here))
    main = importlib.import_module(os.path.basename(_here) + ".protocol").main
    run = importlib.import_module(os.path.basename(_here) + ".run").run

if __name__ == "__main__":
    sys.exit(main(sys.argv, run))
