"""``python -m loadgate`` runs the end-to-end demo (see :mod:`loadgate.demo`)."""

from .demo import main

if __name__ == "__main__":
    raise SystemExit(main())
