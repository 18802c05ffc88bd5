"""TOML text for the C++ readers (job-file tables, plugin options): Python values as literals."""

import json


def literal(value):
    """A bool, number, string or list as a TOML literal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    raise TypeError(f"{value!r} is not a TOML literal (a bool, number, string or list)")


def table(header, keys):
    """`[header]` (none when header is empty) and a `key = literal` line per item of keys."""
    return (f"[{header}]\n" if header else "") + "".join(f"{k} = {literal(v)}\n" for k, v in keys.items())
