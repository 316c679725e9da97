"""``linkguard keys generate``: the service's Ed25519 key pair for signed plans."""

from __future__ import annotations

import argparse
from pathlib import Path

from linkguard.cli.common import fail


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    k = sub.add_parser("keys", help="signing keys for plans (Ed25519)")
    ksub = k.add_subparsers(dest="keys_command", required=True, metavar="SUBCOMMAND")
    kg = ksub.add_parser(
        "generate",
        help="write the service's key pair: service.key (0600) and service.pub",
        description="Write a new Ed25519 key pair for signed plans: DIR/service.key (PEM PKCS "
        "#8, mode 0600: the service's signing_key) and DIR/service.pub (PEM: every agent's "
        "service_public_key). Prints the paths and the key id.",
        epilog="Exit codes: 0 written, 1 DIR cannot be written, 2 a key file exists already "
        "(nothing written; --force replaces both).",
    )
    kg.add_argument("--out", type=Path, required=True, metavar="DIR", help="directory to write")
    kg.add_argument("--force", action="store_true", help="replace an existing key pair")


def run(args: argparse.Namespace) -> int:
    """``keys generate``: :func:`linkguard.signing.generate_keys`."""
    from linkguard.signing import Verifier, generate_keys

    try:
        key, pub = generate_keys(args.out, force=args.force)
    except FileExistsError as exc:
        return fail(f"keys generate: {exc}", 2)
    except OSError as exc:
        return fail(f"keys generate: cannot write {args.out}: {exc.strerror or exc}", 1)
    print(f"signing key (service: signing_key): {key}")
    print(f"public key (agents: service_public_key): {pub}")
    print(f"key id: {Verifier.from_file(pub).key_id}")
    return 0
