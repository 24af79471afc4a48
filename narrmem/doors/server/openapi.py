"""Write the HTTP API's OpenAPI schema: ``python -m narrmem.doors.server.openapi docs/openapi.json``
(a test checks the checked-in copy matches the app)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from narrmem.doors.server.app import openapi_document


def render() -> str:
    return json.dumps(openapi_document(), indent=2, ensure_ascii=False, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m narrmem.doors.server.openapi FILE", file=sys.stderr)
        return 2
    Path(argv[0]).write_text(render(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
