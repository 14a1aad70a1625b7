"""``python app.py``: the CSD Explorer web app, run from a checkout (``csd_app``; once installed,
the ``csd-app`` command runs the same). ``python app.py --help`` lists the options."""
import sys

from csd_app import main

if __name__ == "__main__":
    sys.exit(main())
