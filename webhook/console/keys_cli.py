"""`scheduling-webhook console-keys`: write the console's session key file, or rotate it.

Without a file: one key, sealing at once. With one: `keys.rotated` (a new key that seals after
`--activate-in`, the keys nothing valid is sealed with any more dropped). `--replace`: one new key
at once and nothing else, which signs every user out (for a key that leaked). The file then goes
into the Secret the replicas mount (`manifests/README.md`).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from webhook.console.keys import KeyFileError, format_keys, new_key, parse_keys, rotated
from webhook.console.session import IDLE_TIMEOUT_S


def console_keys_command(args: Any) -> int:
    path = Path(args.file)
    now = time.time()
    activate_in = int(args.activate_in)
    if activate_in < 0:
        print("error: --activate-in must not be negative", file=sys.stderr)
        return 2
    if args.replace or not path.exists():
        keys = [new_key(now)]
    else:
        try:
            keys = rotated(
                parse_keys(path.read_text(encoding="utf-8")),
                now,
                activate_in_s=activate_in,
                cookie_lifetime_s=IDLE_TIMEOUT_S,
            )
        except (KeyFileError, UnicodeDecodeError, OSError) as exc:
            print(f"error: cannot rotate {path}: {exc}", file=sys.stderr)
            return 1
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".new")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(format_keys(keys))
    temporary.replace(path)
    for key in keys:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(key.not_before))
        print(f"{path}: key sealing from {stamp}", file=sys.stderr)
    return 0
