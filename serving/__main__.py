"""``python -m serving [--host H] [--port P] [--port-file F]``: the endpoint without the CLI."""

import argparse
import logging
from pathlib import Path

from infra.settings import get_settings
from serving.server import serve

parser = argparse.ArgumentParser(prog="python -m serving", description=__doc__.split("\n")[0])
parser.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
parser.add_argument("--port", type=int, default=None, help="default 8000; 0 = any free port")
parser.add_argument("--port-file", type=Path, default=None, help="write the bound port here")
args = parser.parse_args()
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
serve(get_settings(), host=args.host, port=args.port, port_file=args.port_file)
