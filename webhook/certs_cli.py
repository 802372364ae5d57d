"""`scheduling-webhook certs`: write a CA (kept if one exists) and a serving certificate."""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path
from typing import Any

from cryptography import x509

from webhook.tls.issuing import (
    CA_CERT_FILE,
    CA_KEY_FILE,
    CERT_FILE,
    CertKey,
    make_ca,
    make_serving_cert,
    reissue_reason,
    sans_of,
    service_dns_names,
    split_names,
    utc_now,
    write_serving_files,
)


def certs_command(args: Any) -> int:
    """`scheduling-webhook certs`: keep an existing CA (unless args.new_ca), always re-issue tls.crt.

    Writes ca.crt, ca.key (0600, needed to re-issue with the same CA), tls.crt, tls.key (0600).
    """
    out = Path(args.out)
    ca_crt, ca_key = out / CA_CERT_FILE, out / CA_KEY_FILE
    new_ca = bool(getattr(args, "new_ca", False))
    days = int(args.days)
    if days < 1:
        print("error: --days must be at least 1", file=sys.stderr)
        return 2
    keep_ca = ca_crt.exists() and not new_ca
    if keep_ca:
        if not ca_key.exists():
            print(f"error: {ca_crt} exists but {ca_key} does not: cannot issue with that CA", file=sys.stderr)
            return 1
        try:
            ca = CertKey.from_pem(ca_crt.read_bytes(), ca_key.read_bytes())
        except ValueError as e:
            print(f"error: cannot use the CA in {out}: {e}", file=sys.stderr)
            return 1
        if ca.cert.not_valid_after_utc <= utc_now() + dt.timedelta(days=1):
            print(
                f"error: the CA in {ca_crt} expires {ca.cert.not_valid_after_utc:%Y-%m-%d}: make a new one",
                file=sys.stderr,
            )
            return 1
    else:
        ca = make_ca(days=max(days, 3650))
    try:
        wanted = split_names([*service_dns_names(args.service, args.namespace), *args.hostname], args.ip)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if keep_ca and getattr(args, "keep_valid", False):
        why_not = reissue_reason(out, ca, wanted)
        if why_not is None:
            current = x509.load_pem_x509_certificate((out / CERT_FILE).read_bytes())
            print(f"kept {out / CERT_FILE} (valid for the names asked, expires {current.not_valid_after_utc:%Y-%m-%d})")
            return 0
        print(f"re-issuing {out / CERT_FILE}: {why_not}")
    serving = make_serving_cert(ca, args.service, args.namespace, dns_names=args.hostname, ips=args.ip, days=days)
    written = write_serving_files(out, ca, serving, write_ca=not keep_ca)
    ca_name = ca.cert.subject.rfc4514_string()
    if keep_ca:
        print(f"kept CA {ca_crt} ({ca_name}, expires {ca.cert.not_valid_after_utc:%Y-%m-%d})")
    else:
        print(f"new CA {ca_crt} ({ca_name}, expires {ca.cert.not_valid_after_utc:%Y-%m-%d})")
    dns, addrs = sans_of(serving.cert)
    names = ", ".join([*dns, *(str(a) for a in addrs)])
    for path in written:
        mode = path.stat().st_mode & 0o777
        what = f"serving certificate for {names}, expires {serving.cert.not_valid_after_utc:%Y-%m-%d}"
        print(f"wrote {path} ({oct(mode)[2:]}{': ' + what if path.name == CERT_FILE else ''})")
    return 0
