"""``python app.py``: the web app from a checkout (``csd_app``; installed, ``csd-app``). A checkout reaches csd.ui,
csd.db, ... through the set-up's editable install; where only requirements.txt went in (a Hugging Face Space
builds so), the first start makes that install (pip install --no-deps -e .) and starts again."""
import os
import subprocess
import sys
from importlib.util import find_spec

if __name__ == "__main__":
    if find_spec("csd.ui") is None:
        print("CSD Explorer: installing this checkout once (pip install --no-deps -e .)…", file=sys.stderr, flush=True)
        checkout = os.path.dirname(__file__) or "."
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "-e", checkout], check=True)
        os.execv(sys.executable, [sys.executable, *sys.argv])
    from csd_app import main
    sys.exit(main())
