#!/usr/bin/env python3
"""Writes the permissions table of docs/clients.md from clients/vectors/permissions.json.

The libraries' tests create their least-privilege users from the JSON, so the table a reader
copies rules from is the one the tests apply. The table sits between the two marker comments
`<!-- permissions begin -->` and `<!-- permissions end -->`.

    python3 clients/vectors/permissions.py           # rewrite the table in docs/clients.md
    python3 clients/vectors/permissions.py --check   # exit 1 if the table is stale
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RULES = os.path.join(HERE, "permissions.json")
DOCS = os.path.join(HERE, "..", "..", "docs", "clients.md")
BEGIN, END = "<!-- permissions begin -->", "<!-- permissions end -->"

PATHS = [
    ("module", "the module (`RL.*` commands)"),
    ("functions", "the Functions library (`FCALL`, `FCALL_RO`)"),
    ("script", "the script, `EVALSHA` then `EVAL` on `NOSCRIPT`"),
    ("script_preloaded", "the script, `EVALSHA` only, loaded by an admin (again after every flush, restart or failover)"),
]


def rules(words):
    return "`" + " ".join(words) + "`"


def table():
    with open(RULES) as f:
        data = json.load(f)
    lines = [
        "| path | a user who decides (acquire, peek, refund, charge, all or nothing) | a read-only peek user | a table's `delete` and `len` add |",
        "| --- | --- | --- | --- |",
    ]
    for name, title in PATHS:
        path = data["paths"][name]
        lines.append(f"| {title} | {rules(path['decide'])} | {rules(path['peek'])} | {rules(path['tables'])} |")
    lines += [
        "",
        "| path | a user of leases (take, release, renew, count) | reservations (reserve, settle) add to a deciding user's |",
        "| --- | --- | --- |",
    ]
    for name, title in PATHS:
        path = data["paths"][name]
        lines.append(f"| {title} | {rules(path['leases'])} | {rules(path['reservations'])} |")
    lines += [
        "",
        f"Every user also needs {rules(data['connection'])} (the client's handshake: `HELLO`, `AUTH`, "
        f"`PING`, `CLIENT SETINFO`, `SELECT`), and on a cluster {rules(data['cluster'])}. "
        f"The admin who loads the Functions library needs {rules(data['admin']['load_functions'])}.",
    ]
    return "\n".join(lines) + "\n"


def render(text):
    try:
        head, rest = text.split(BEGIN + "\n", 1)
        _, tail = rest.split(END, 1)
    except ValueError:
        raise SystemExit(f"docs/clients.md must hold one {BEGIN} line and one {END}")
    return head + BEGIN + "\n" + table() + END + tail


def main(argv):
    with open(DOCS) as f:
        text = f.read()
    new = render(text)
    if "--check" in argv:
        if new != text:
            print("docs/clients.md's permissions table differs from clients/vectors/permissions.json: "
                  "run python3 clients/vectors/permissions.py", file=sys.stderr)
            return 1
        return 0
    with open(DOCS, "w") as f:
        f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
