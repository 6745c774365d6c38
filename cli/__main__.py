"""``python -m dyn.cli`` runs the ``dyn`` command (handy where the console script is not on PATH)."""

from dyn.cli.app import main

if __name__ == "__main__":  # not when multiprocessing's spawn re-imports it in a child
    main()
