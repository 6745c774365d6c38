"""``python -m dyn.cli`` runs the ``dyn`` command (handy where the console script is not on PATH)."""

from dyn.cli.app import main

main()
