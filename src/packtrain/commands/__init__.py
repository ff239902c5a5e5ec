


def nested_common(p) -> None:
    """--recipe/--set on a command's own subcommand too (`packtrain mlflow replay --recipe r`,
    `packtrain pipeline export pack --recipe params.yaml`); SUPPRESS keeps the value given before the
    subcommand when they are absent here."""
    import argparse

    p.add_argument("--recipe", default=argparse.SUPPRESS, help="recipe name in recipes/ or a YAML path")
    p.add_argument("--set", dest="overrides", action="append", default=argparse.SUPPRESS, metavar="KEY=VALUE",
                   help="override a config value, e.g. --set pack.budget=4096 (repeatable)")

